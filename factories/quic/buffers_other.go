//go:build !linux

package quic

import "net"

func forceBuffers(*net.UDPConn, int) {}

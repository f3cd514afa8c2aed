//go:build !linux

package netconn

import "net"

func forceUDPBuffers(*net.UDPConn, int) {}

//go:build !linux

package netconn

import "net"

func readTCPCounts(*net.TCPConn) (TCPCounts, bool) { return TCPCounts{}, false }

func tcpClosed(*net.TCPConn) bool { return false }

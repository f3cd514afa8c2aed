//go:build unix

package vlink

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// peekQueued copies into buf, without consuming them, the bytes c's
// socket has received and not yet delivered, and returns how many.
func peekQueued(c net.Conn, buf []byte) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		m, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == nil {
			n = m
		}
	})
	return n
}

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

// peekFirst waits, until c's read deadline, for c's first byte and returns
// it without consuming it (n is 0 at end of stream). ok is false when c is
// not a socket it can peek at: the caller reads instead.
func peekFirst(c net.Conn) (b byte, n int, ok bool, err error) {
	sc, isSock := c.(syscall.Conn)
	if !isSock {
		return 0, 0, false, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, 0, false, nil
	}
	var buf [1]byte
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		n, _, perr = unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return perr != unix.EAGAIN && perr != unix.EINTR
	})
	if err == nil && perr != nil {
		if perr == unix.ENOTSOCK || perr == unix.EOPNOTSUPP {
			return 0, 0, false, nil
		}
		err = perr
	}
	return buf[0], n, true, err
}

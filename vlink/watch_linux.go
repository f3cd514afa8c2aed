package vlink

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// waitWhole waits, at most d, until the bytes waiting in c hold a whole
// hello, or bytes that are no hello (wholeHello), and reports whether
// they do. It reads nothing: the netpoller wakes it as bytes come, and it
// looks at the first ones and counts the rest.
func waitWhole(c net.Conn, d time.Duration) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil || c.SetReadDeadline(time.Now().Add(d)) != nil {
		return false
	}
	defer c.SetReadDeadline(time.Time{})
	whole := false
	rc.Read(func(fd uintptr) bool {
		var b [len(magic) + headerSize]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			return false
		case err != nil || n == 0:
			return true // reset or closed: whoever reads it next says so
		case wholeHello(b[:n]):
			whole = true
			return true
		case n < len(b):
			return false
		}
		queued, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
		whole = err == nil && queued >= len(b)+header(b[len(magic):]).Len()
		return whole
	})
	return whole
}

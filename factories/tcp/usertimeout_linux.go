package tcp

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// setUserTimeout bounds how long data sent may stay unacknowledged
// before the kernel fails the connection (TCP_USER_TIMEOUT): without it,
// a side with data in flight on a dead path retries for the kernel's
// tcp_retries2 (about 15 minutes), where an idle side notices at the
// keep-alives' bound. A listener's sockets pass it on to those they
// accept.
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}

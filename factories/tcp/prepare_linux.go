package tcp

import (
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// PrepareSocket sets on a socket not yet connected the options
// DialContext's connections get: congestion control, TCP_USER_TIMEOUT,
// keep-alives and TCP_NODELAY. It is for a dialer of its own (an event
// loop, netconn/evloop): rc's Control reaches the socket.
func (f *Factory) PrepareSocket(rc syscall.RawConn) error {
	if err := f.control("", "", rc); err != nil {
		return err
	}
	ka := f.keepAlive()
	var serr error
	err := rc.Control(func(fd uintptr) {
		set := func(level, opt, v int) {
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), level, opt, v)
			}
		}
		if ka.Enable {
			set(unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
			set(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs(ka.Idle))
			set(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs(ka.Interval))
			set(unix.IPPROTO_TCP, unix.TCP_KEEPCNT, ka.Count)
		}
		nodelay := 1
		if f.o.NoNagle {
			nodelay = 0
		}
		set(unix.IPPROTO_TCP, unix.TCP_NODELAY, nodelay)
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return &net.OpError{Op: "setsockopt", Net: "tcp", Err: os.NewSyscallError("setsockopt", serr)}
	}
	return nil
}

// secs rounds d up to whole seconds, as the net package does for
// keep-alive times.
func secs(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

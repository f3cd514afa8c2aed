package tcp

import (
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/netconn"
)

// PrepareSocket sets on a socket not yet connected the options
// DialContext's connections get (SocketOptions): congestion control,
// TCP_USER_TIMEOUT, keep-alives and TCP_NODELAY. It is for a dialer of
// its own (an event loop, netconn/evloop): rc's Control reaches the
// socket.
func (f *Factory) PrepareSocket(rc syscall.RawConn) error {
	for _, o := range f.SocketOptions() {
		if o.Name == unix.TCP_CONGESTION && o.Level == unix.IPPROTO_TCP {
			if err := netconn.SetCongestionControlRaw(rc, o.Str); err != nil {
				return err
			}
			continue
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), o.Level, o.Name, o.Int) }); err != nil {
			return err
		}
		if serr != nil {
			return &net.OpError{Op: "setsockopt", Net: "tcp", Err: os.NewSyscallError("setsockopt", serr)}
		}
	}
	return nil
}

// A SocketOption is one setsockopt(2) of PrepareSocket's: an integer
// value, or for TCP_CONGESTION a name (Str).
type SocketOption struct {
	Level, Name int
	Int         int
	Str         string
}

// SocketOptions returns the options PrepareSocket sets, in its order,
// for a dialer that sets them by other means (vlink exec's shim, from
// what its agent tells it).
func (f *Factory) SocketOptions() []SocketOption {
	var opts []SocketOption
	if cc := f.o.CongestionControl; cc != "" {
		opts = append(opts, SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_CONGESTION, Str: cc})
	}
	if d := f.userTimeout(); d > 0 {
		opts = append(opts, SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_USER_TIMEOUT, Int: int(d.Milliseconds())})
	}
	if ka := f.keepAlive(); ka.Enable {
		opts = append(opts,
			SocketOption{Level: unix.SOL_SOCKET, Name: unix.SO_KEEPALIVE, Int: 1},
			SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_KEEPIDLE, Int: secs(ka.Idle)},
			SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_KEEPINTVL, Int: secs(ka.Interval)},
			SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_KEEPCNT, Int: ka.Count})
	}
	nodelay := 1
	if f.o.NoNagle {
		nodelay = 0
	}
	return append(opts, SocketOption{Level: unix.IPPROTO_TCP, Name: unix.TCP_NODELAY, Int: nodelay})
}

// secs rounds d up to whole seconds, as the net package does for
// keep-alive times.
func secs(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

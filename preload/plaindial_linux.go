package preload

import (
	"context"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/selector"
)

// A blocking connect whose rule is the tcp factory alone, without a
// gateway, to an address (tcp's options for some destinations, such as
// tcp:cc=bbr for a long path) is plain TCP from the first byte: the agent
// connects with blocking system calls on the channel's own thread, which
// the shim's question woke, and passes the program the socket. Through
// the stacks' dialer the same connect parked in the netpoller and woke
// other threads: 135 µs over a direct connect against 72 (BENCHMARKS §3,
// "Connect cost through a gateway, profiled"). Only a short wait pays
// so: one of hundreds of microseconds loses the thread's P to sysmon and
// costs as much as the netpoller (a gateway's answer, until the gateway
// answered on its event loop: gatewaydial_linux.go).

// plainFactory returns the tcp factory of d's stack when the agent can
// make d's connect to target itself: tcp alone, no gateway, options that
// PrepareSocket carries out (tcp.PreparedLayer), target an address of
// the program socket's family fam (4 or 6). Else nil: the stacks dial.
func plainFactory(d decision, target string, fam uint8) (*tcp.Factory, netip.AddrPort) {
	if d.rule.Action != selector.Stack || d.rule.Via != "" || len(d.stack.Layers) != 1 {
		return nil, netip.AddrPort{}
	}
	to, err := netip.ParseAddrPort(target)
	if err != nil || to.Addr().Zone() != "" {
		return nil, netip.AddrPort{}
	}
	if to.Addr().Is4() != (fam == 4) {
		return nil, netip.AddrPort{}
	}
	l := d.stack.Layers[0]
	return tcp.PreparedLayer(l.Name, l.Params, to.Addr()), to
}

// dialPlain connects a socket with f's options to to, waiting at most
// timeout in poll(2), and returns it (non-blocking, as net.Dialer leaves
// its sockets: the shim gives it the program's own flags). ctx ends the
// wait early (the agent closing): the wait is cut into slices so that the
// thread notices.
func dialPlain(ctx context.Context, f *tcp.Factory, to netip.AddrPort, timeout time.Duration) (int, error) {
	family, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()})
	if to.Addr().Is6() {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if err := f.PrepareSocket(rawFD(fd)); err != nil {
		return -1, err
	}
	for {
		err = unix.Connect(fd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EINPROGRESS {
		err = waitConnected(ctx, fd, time.Now().Add(timeout))
	}
	if err != nil {
		return -1, os.NewSyscallError("connect", err)
	}
	ok = true
	return fd, nil
}

// pollSlice bounds one wait of dialPlain, so that a closing agent is
// noticed within it.
const pollSlice = 100 * time.Millisecond

// waitConnected waits in poll(2) for fd's connect to finish by deadline,
// and returns its outcome (SO_ERROR), os.ErrDeadlineExceeded at the
// deadline (the program sees ETIMEDOUT), or ctx's error.
func waitConnected(ctx context.Context, fd int, deadline time.Time) error {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := unix.Poll(pfd, int(min(left, pollSlice).Milliseconds())+1)
		if err == unix.EINTR || err == nil && n == 0 {
			continue
		}
		if err != nil {
			return err
		}
		soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soerr != 0 {
			return syscall.Errno(soerr)
		}
		return nil
	}
}

// rawFD is a socket not yet wrapped, as a syscall.RawConn for
// tcp.Factory.PrepareSocket.
type rawFD int

func (fd rawFD) Control(f func(fd uintptr)) error { f(uintptr(fd)); return nil }
func (rawFD) Read(func(fd uintptr) bool) error    { return errUnsupportedRaw }
func (rawFD) Write(func(fd uintptr) bool) error   { return errUnsupportedRaw }

var errUnsupportedRaw = syscall.ENOTSUP

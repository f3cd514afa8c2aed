package preload

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// A non-blocking connect through a stack must complete when the far side
// does, and fail with the far side's errno, because that is where event
// loops look: writability, then SO_ERROR. The program's socket is the
// kernel's, so the kernel must hold it in SYN-SENT until then:
//
//   - The program's socket connects to the held listener, a loopback
//     listener that never answers a SYN: its backlog is 0 and its accept
//     queue holds a connection of the agent's own that is never accepted,
//     so the kernel drops every new SYN (a full accept queue), silently.
//     The connect returns EINPROGRESS and the socket stays unwritable,
//     retransmitting its SYN as to a silent host.
//   - When the far side answered, the agent connects from the held
//     listener's own address (SO_REUSEPORT) to the program's socket. Its
//     SYN meets the program's SYN-SENT socket: a TCP simultaneous open
//     (RFC 9293 §3.5), which both kernels complete within microseconds.
//     The program's socket becomes writable, SO_ERROR 0, connected to the
//     agent's socket, which relays to the stack.
//   - When the far side failed, the agent does the same with
//     TCP_DEFER_ACCEPT set on its socket, which makes it withhold the
//     handshake's last ACK: the program's socket stays in SYN-RECEIVED,
//     still unwritable, until the agent resets the connection a moment
//     later. So the program never sees it connected: it wakes with an
//     error (POLLERR, ECONNRESET), and the shim, seeing the reset in
//     SO_ERROR or a second connect, asks the agent why (msgWhy) and
//     reports the dial's errno (ECONNREFUSED, ETIMEDOUT...). A reset makes
//     a socket fail with ECONNREFUSED only if it answers its SYN, which
//     the listener drops; hence the question, asked on failures only.
//
// Only same-user sockets may share a SO_REUSEPORT port, so no other user
// can take the listener's place. None of this needs a privilege. (A socket
// filter dropping every segment would say "never answer" more directly,
// but kernels may refuse classic BPF filters to unprivileged users, as
// this project's CI machines do.)

// A heldListener never completes a handshake (see above).
type heldListener struct {
	*net.TCPListener
	filler net.Conn // fills the accept queue
}

// heldListen listens on ip with SO_REUSEPORT and a full accept queue, so
// that nothing connects to it.
func heldListen(network string, ip netip.Addr) (*heldListener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	l, err := lc.Listen(context.Background(), network, netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return nil, err
	}
	h := &heldListener{TCPListener: l.(*net.TCPListener)}
	// listen again, with a backlog of 0: one queued connection fills it.
	rc, err := h.SyscallConn()
	if err == nil {
		if cerr := rc.Control(func(fd uintptr) { err = unix.Listen(int(fd), 0) }); cerr != nil {
			err = cerr
		}
	}
	if err == nil {
		d := net.Dialer{KeepAlive: -1}
		h.filler, err = d.Dial(network, h.Addr().String())
	}
	if err != nil {
		h.TCPListener.Close()
		return nil, fmt.Errorf("held listener: %w", err)
	}
	return h, nil
}

// Close closes the listener and its filler.
func (h *heldListener) Close() error {
	h.filler.Close()
	return h.TCPListener.Close()
}

// release completes a held connect: it connects from the held listener's
// address to the program's socket at prog, which is in SYN-SENT towards
// that address. With fail, the program's side is left in SYN-RECEIVED, for
// the caller to reset. ctx bounds the wait (the program may have closed
// its socket, or given up).
func release(ctx context.Context, held *heldListener, prog netip.AddrPort, fail bool) (*net.TCPConn, error) {
	d := net.Dialer{
		LocalAddr: held.Addr(),
		KeepAlive: -1,
		Control: func(_, _ string, rc syscall.RawConn) error {
			var err error
			if cerr := rc.Control(func(fd uintptr) {
				if err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil || !fail {
					return
				}
				// Withholds the ACK of the program's SYN-ACK until data
				// or a delayed-ACK timeout, neither of which comes.
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
			}); cerr != nil {
				return cerr
			}
			return err
		},
	}
	network := "tcp4"
	if prog.Addr().Is6() {
		network = "tcp6"
	}
	c, err := d.DialContext(ctx, network, prog.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

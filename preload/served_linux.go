package preload

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// Serving: an unmodified server takes VLink clients on its own port.
//
//   - The shim binds a socket the program binds to a served port to a
//     loopback port instead (its private port), and when it listens,
//     tells the agent (msgListen).
//   - The agent listens on the address the program asked for with a
//     vlink.Listener, under ServeConfig's policy, and hands each client to
//     one of the program's private ports (round robin over the processes
//     that listen, as SO_REUSEPORT would), by connecting to it.
//   - The program's accept takes that connection; the shim asks the agent
//     whose it is (msgAccepted). A plain client's own socket comes back
//     (SCM_RIGHTS) and replaces it: the program has the client's
//     descriptor, and the agent is out of the path. A VLink client stays
//     relayed over it, and getpeername and getsockname answer the
//     client's addresses.
//   - A connection the agent did not make (another local process
//     connecting to a private port) is dropped: the policy is not to be
//     bypassed.

// ServeConfig makes the program's listeners on Ports take VLink clients.
type ServeConfig struct {
	// Ports are the TCP ports, as the program binds them, on which it
	// takes VLink clients (at most 64).
	Ports []uint16
	// Listen configures the listener that takes the clients in the
	// program's place: its Policy (key, layers, limits, plain clients),
	// handshake bounds and logger. Stack, Admit and Lookup are not used.
	Listen vlink.ListenConfig
}

// Validate reports whether c is usable.
func (c *ServeConfig) Validate() error {
	if len(c.Ports) > maxServed {
		return fmt.Errorf("preload: %d served ports, at most %d", len(c.Ports), maxServed)
	}
	for _, p := range c.Ports {
		if p == 0 {
			return errors.New("preload: served port 0")
		}
	}
	return c.Listen.Policy.Validate()
}

// acceptWait bounds how long a client handed to the program waits for the
// program's accept to ask about it.
const acceptWait = time.Minute

// A served listener: the agent's vlink.Listener on an address the program
// bound, and the program's private ports it hands clients to.
type served struct {
	ln      *vlink.Listener
	mu      sync.Mutex
	private []netip.AddrPort
	next    int
}

// A handed client waits for the program's accept to ask about it.
type handed struct {
	c     *vlink.Conn
	plain *net.TCPConn  // the client's own socket, if it can be passed
	x     net.Conn      // the agent's end of the connection to the private port, once ready
	ready chan struct{} // closed once x is set
	info  acceptInfo
	timer *time.Timer
}

// listen registers a program's private listener for the address it bound,
// listening there first if no process of the program did yet. It returns
// the errno the program's listen gets.
func (a *Agent) listen(req listenReq) syscall.Errno {
	if a.serve == nil || !slices.Contains(a.serve.Ports, req.bound.Port()) || !req.private.Addr().IsLoopback() {
		return syscall.EINVAL
	}
	bound := netip.AddrPortFrom(req.bound.Addr().Unmap(), req.bound.Port())
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return syscall.ECONNREFUSED
	}
	s := a.served[bound]
	if s == nil {
		lc := a.serve.Listen
		lc.Stack, lc.Admit, lc.Lookup = vlink.Stack{}, nil, nil
		if lc.Logger == nil {
			lc.Logger = a.log
		}
		network := "tcp4"
		if bound.Addr().Is6() {
			network = "tcp" // [::] takes IPv4 too, as the program's socket would by default
		}
		ln, err := lc.Listen(a.ctx, network, bound.String())
		if err != nil {
			a.log.Warn("cannot listen in the program's place", "addr", bound.String(), "err", err)
			var en syscall.Errno
			if errors.As(err, &en) {
				return en
			}
			return syscall.EADDRINUSE
		}
		s = &served{ln: ln}
		a.served[bound] = s
		a.wg.Add(1)
		go a.serveClients(s)
		a.log.Info("taking VLink clients in the program's place", "addr", bound.String())
	}
	s.mu.Lock()
	if !slices.Contains(s.private, req.private) {
		s.private = append(s.private, req.private)
		a.log.Debug("a socket of the program listens", "addr", bound.String(), "private", req.private.String(), "sockets", len(s.private))
	}
	s.mu.Unlock()
	return 0
}

// serveClients accepts s's clients and hands each to the program.
func (a *Agent) serveClients(s *served) {
	defer a.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // the listener retries temporary failures itself
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.hand(s, c.(*vlink.Conn))
		}()
	}
}

// hand connects to one of the program's private ports for client c.
func (a *Agent) hand(s *served, c *vlink.Conn) {
	h := &handed{c: c, ready: make(chan struct{}), info: acceptInfo{kind: acceptRelayed, remote: addrPort(c.RemoteAddr()), local: addrPort(c.LocalAddr())}}
	if hello := c.Hello(); hello != nil && hello.RemoteAddr != nil {
		h.info.remote = addrPort(hello.RemoteAddr)
	}
	if c.Hello() == nil {
		if tc := plainTCP(c); tc != nil {
			h.plain, h.info.kind = tc, acceptPlain
		}
	}
	for h.x == nil {
		s.mu.Lock()
		if len(s.private) == 0 {
			s.mu.Unlock()
			a.log.Info("no process of the program listens any more: dropping a client", "remote", h.info.remote.String())
			netconn.Abort(c)
			return
		}
		s.next = (s.next + 1) % len(s.private)
		to := s.private[s.next]
		s.mu.Unlock()
		if err := a.dialPrivate(to, h); err != nil {
			// That process closed its listener, or exited.
			s.mu.Lock()
			s.private = slices.DeleteFunc(s.private, func(p netip.AddrPort) bool { return p == to })
			s.mu.Unlock()
		}
	}
	close(h.ready)
	if !a.track(h.x) {
		netconn.Abort(c)
		return
	}
	if h.plain != nil {
		return // the program's accept takes the client's own socket (acceptInfo)
	}
	a.relay(h.x, c, []any{"served", h.info.local.String(), "remote", h.info.remote.String()})
}

// dialPrivate connects to a private port for h. The connection is
// registered under its local address before it is made, so the program's
// accept never asks about a connection the agent does not know yet.
func (a *Agent) dialPrivate(to netip.AddrPort, h *handed) error {
	var key netip.AddrPort
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			var sa unix.Sockaddr
			if to.Addr().Is4() {
				sa = &unix.SockaddrInet4{Addr: to.Addr().As4()}
			} else {
				sa = &unix.SockaddrInet6{Addr: to.Addr().As16()}
			}
			if err = unix.Bind(int(fd), sa); err != nil {
				return
			}
			var lsa unix.Sockaddr
			if lsa, err = unix.Getsockname(int(fd)); err != nil {
				return
			}
			switch l := lsa.(type) {
			case *unix.SockaddrInet4:
				key = netip.AddrPortFrom(netip.AddrFrom4(l.Addr), uint16(l.Port))
			case *unix.SockaddrInet6:
				key = netip.AddrPortFrom(netip.AddrFrom16(l.Addr), uint16(l.Port))
			}
			a.mu.Lock()
			h.timer = time.AfterFunc(acceptWait, func() { a.dropHanded(key, h) })
			a.handed[key] = h
			a.mu.Unlock()
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	x, err := d.Dial("tcp", to.String())
	if err != nil {
		if key.IsValid() {
			a.mu.Lock()
			if a.handed[key] == h {
				delete(a.handed, key)
				h.timer.Stop()
			}
			a.mu.Unlock()
		}
		return err
	}
	h.x = x
	return nil
}

// dropHanded forgets a handed client the program never asked about.
func (a *Agent) dropHanded(key netip.AddrPort, h *handed) {
	a.mu.Lock()
	if a.handed[key] != h {
		a.mu.Unlock()
		return
	}
	delete(a.handed, key)
	a.mu.Unlock()
	if h.plain != nil {
		<-h.ready
		a.untrack(h.x)
		h.x.Close()
		netconn.Abort(h.c)
	}
}

// accepted answers the shim's question about a connection its program
// accepted on a private port: the agent's end is at from.
func (a *Agent) accepted(c *chanConn, from sockAddr) error {
	key := netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	a.mu.Lock()
	h := a.handed[key]
	delete(a.handed, key)
	a.mu.Unlock()
	if h == nil {
		return writeAcceptInfo(c, acceptInfo{kind: acceptUnknown}, nil)
	}
	// Registered before it connected: the agent's dial may not have
	// returned yet.
	select {
	case <-h.ready:
	case <-a.ctx.Done():
		return writeAcceptInfo(c, acceptInfo{kind: acceptUnknown}, nil)
	}
	h.timer.Stop()
	if h.plain == nil {
		return writeAcceptInfo(c, h.info, nil)
	}
	err := writeAcceptInfo(c, h.info, h.plain)
	// The program has the client's socket now (or failed to take it):
	// the agent's copies go.
	a.untrack(h.x)
	h.x.Close()
	h.c.Close()
	return err
}

func writeAcceptInfo(c *chanConn, info acceptInfo, fd *net.TCPConn) error {
	frame := appendFrame(nil, msgAcceptInfo, info.append(nil))
	if fd == nil {
		_, err := c.Write(frame)
		return err
	}
	return sendFD(c, frame, fd)
}

func addrPort(a net.Addr) netip.AddrPort {
	if ap, ok := netconn.AddrPort(a); ok {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// closeServed closes the agent's listeners in the program's place and the
// plain clients the program never took; under a.mu, from Close.
func (a *Agent) closeServed() {
	for _, s := range a.served {
		s.ln.Close()
	}
	for key, h := range a.handed {
		h.timer.Stop()
		delete(a.handed, key)
		if h.plain != nil {
			netconn.Abort(h.c) // h.x is tracked: Close aborts it
		}
	}
}

package serve

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/forward"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/evloop"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// listen makes the forward's listener: on an event loop (netconn/evloop)
// when --event-loop allows and the listener has no key and no other
// transport, so that a hello the policy takes as it is (a tcp route's,
// vlink exec's) to a target given as an IP address is answered, dialed
// and relayed on one goroutine, as the tunnel's plain relay is; every
// other connection goes the listener's way, handed off with its bytes
// unread. The loop is nil when there is none.
func (f *serveForward) listen(ctx context.Context, e *base.Env, lc *vlink.ListenConfig) (*vlink.Listener, *evloop.Loop, error) {
	o := f.o
	if !o.eventLoop || lc.Stack.Layers != nil || lc.Shm || lc.Quic || lc.Policy.Key != nil || lc.Policy.Member != nil {
		l, err := lc.Listen(ctx, "tcp", o.listen)
		return l, nil, err
	}
	var nlc net.ListenConfig
	nl, err := nlc.Listen(ctx, "tcp", o.listen)
	if err != nil {
		return nil, nil, err
	}
	g := &greeter{s: &f.s}
	// The loop's connects count as the listener's handshakes do (admit
	// dials within them): past as many, the loop hands connections to
	// the listener, which parks or sheds them.
	maxConnecting := lc.MaxHandshakes
	if maxConnecting <= 0 {
		maxConnecting = vlink.DefaultMaxHandshakes
	}
	lp, err := evloop.Listen(nl.(*net.TCPListener), evloop.Config{Greeter: g, HandOff: g.handOff, MaxConnecting: maxConnecting},
		f.s.t.LoopHandler(e.Log, metrics.Labels{Forward: f.s.forward, Transport: metrics.TransportTCP}, nl.Addr().String(), ""))
	if err != nil {
		if !errors.Is(err, evloop.ErrUnsupported) {
			e.Log.Warn("no event loop; a goroutine per connection", "err", err)
		}
		nl.Close()
		l, err := lc.Listen(ctx, "tcp", o.listen)
		return l, nil, err
	}
	l, err := lc.NewListener(lp)
	if err != nil {
		lp.Close()
		return nil, nil, err
	}
	g.l.Store(l)
	return l, lp, nil
}

// greeter takes, on the event loop, the hellos the listener answers from
// their bytes alone (vlink.Listener.QuickHello) and whose target serve
// dials as an address with nothing to send first.
type greeter struct {
	s *server
	l atomic.Pointer[vlink.Listener] // nil until the listener is made: all go its way
}

var _ evloop.Greeter = (*greeter)(nil)

func (g *greeter) Greet(c *evloop.Conn, first []byte) (evloop.Greeting, bool) {
	l := g.l.Load()
	if l == nil {
		return evloop.Greeting{}, false
	}
	start := time.Now()
	remote := net.TCPAddrFromAddrPort(c.Remote)
	q, ok := l.QuickHello(first, remote, start)
	if !ok {
		return evloop.Greeting{}, false
	}
	h := q.Hello
	to, err := netip.ParseAddrPort(h.Target)
	if err != nil || to.Addr().Zone() != "" || g.proxied(h.Target) {
		// A name is resolved, a PROXY header sent, on a goroutine.
		return evloop.Greeting{}, false
	}
	q.Taken()
	stack := metrics.HelloStackLabel(h)
	g.s.t.Metrics.HandshakeDone(stack, time.Since(start))
	c.Value = &forward.LoopGreeting{Stack: stack, Value: q,
		Attrs: []any{"remote", remote.String(), "stack", h.Stack.String(), "target", h.Target, "authenticated", h.Authenticated}}
	// As admit dials: a dialer that waits longer for its target (a
	// program's connect under vlink exec) has it, within the handshake's
	// deadline, which its wait moved.
	deadline := start.Add(max(g.s.dialTimeout, h.TargetWait))
	if q.Deadline.Before(deadline) {
		deadline = q.Deadline
	}
	gr := evloop.Greeting{Target: to, Consume: q.Len, Reply: q.Accept, Deadline: deadline}
	if cc := h.CongestionControl; cc != "" {
		gr.Control = func(rc syscall.RawConn) error { return netconn.SetCongestionControlRaw(rc, cc) }
	}
	return gr, true
}

// Refusal is the refusal admit would send for a target that could not be
// reached, logged as admit logs it.
func (g *greeter) Refusal(c *evloop.Conn, err error) []byte {
	lg := forward.GreetingOf(c)
	if lg == nil {
		return nil
	}
	g.s.log.Warn("target unreachable", "remote", c.Remote.String(), "target", c.Target.String(), "err", err)
	return lg.Value.(*vlink.QuickHello).Refusal(vlink.TargetRefusal(err))
}

// handOff starts the listener's handshake of a connection the loop did
// not take, on a goroutine of its own; before the listener is made, the
// loop keeps it for the listener's Accept.
func (g *greeter) handOff(c net.Conn) bool {
	l := g.l.Load()
	if l == nil {
		return false
	}
	l.Take(c)
	return true
}

// proxied reports whether target gets a PROXY header (--proxy-protocol).
func (g *greeter) proxied(target string) bool {
	if g.s.proxy == nil {
		return false
	}
	r, err := g.s.proxy.Match(target)
	return err == nil && r.Action != selector.Refuse
}

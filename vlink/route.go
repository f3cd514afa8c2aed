package vlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Route layers (fwd) carry a connection through a chain of nodes, each a
// VLink listener that forwards. The dialer reaches the first node
// through its factories and sends it a hello naming the other nodes
// ("hops") and, last, the peer. Each node checks the next against its
// policy (Policy.Hops), reaches it by a way of its own choosing, and
// sends it a hello naming the hops after it, the trail of listeners
// crossed so far (for loops) and the origin it vouches for with its key.
// The peer takes that last hello as the end of the route, and then the
// dialer's own hello, end to end: the mirrored layers run between the
// dialer and the peer alone, so the nodes on the way carry bytes they
// cannot read (compressed, and encrypted when the key is set). A refusal
// anywhere comes back to the dialer, saying which node refused.
//
// The route hellos carry no stack and no target: those are the
// end-to-end hello's.

// routed reports whether h goes on to other nodes or ends a route here:
// its bytes are another hello's, checked where it ends.
func (h *Hello) routed() bool { return h.route }

// ends reports whether h is the last node's hello at the peer: the
// dialer's end-to-end hello follows.
func (h *Hello) ends() bool { return h.route && len(h.Hops) == 0 }

// checkRoute checks the route fields of a hello (hops, trail, origin)
// and records them in h. inner is true for a nested or end-to-end hello,
// which carries none.
func (l *Listener) checkRoute(m *message, h *Hello, inner bool) *RefusedError {
	if len(m.hops) == 0 && len(m.trail) == 0 && m.origin == "" {
		return nil
	}
	switch {
	case inner:
		return refuse(CodeMalformed, "a nested or end-to-end hello names no hops, trail or origin: the hello of its connection did")
	case m.stack != "" || m.target != "":
		return refuse(CodeMalformed, "a hello that goes through route layers names no stack and no target: the end-to-end hello after it does")
	case m.origin != "" && len(m.trail) == 0:
		return refuse(CodeMalformed, "only a forwarding node vouches for an origin, and its hello has a trail")
	case m.origin != "" && !h.Authenticated:
		return refuse(CodeAuthRequired, "the node before this one vouches for the connection's origin, and this listener has no key to check it by: give the nodes of a route one key (vlink serve --key-file)")
	}
	for i := 0; i < len(m.trail); i += trailIDSize {
		if bytes.Equal(m.trail[i:i+trailIDSize], l.id[:]) {
			return refuse(CodeLoop, "the connection already crossed this node, as hop %d: the route goes round in a loop", i/trailIDSize+1)
		}
	}
	crossed := len(m.trail) / trailIDSize
	if crossed+len(m.hops) > MaxHops {
		return refuse(CodeLoop, "the route crosses %d nodes, at most %d", crossed+len(m.hops), MaxHops)
	}
	if len(m.hops) > 0 {
		if l.hops == nil {
			return refuse(CodeTarget, "this node forwards to no other node (vlink serve --hop PATTERN lets it)")
		}
		if r, err := l.hops.Match(m.hops[0]); err != nil || r.Action == selector.Refuse {
			return refuse(CodeTarget, "forwarding to the next node, %s, is not allowed here", m.hops[0])
		}
	}
	h.route, h.Hops, h.trail, h.Forwarded = true, m.hops, m.trail, crossed
	if m.origin != "" {
		h.RemoteAddr = net.TCPAddrFromAddrPort(netip.MustParseAddrPort(m.origin)) // checked by decodeBody
	}
	return nil
}

// DialNextHop carries the connection of h on to the next node it names
// (Hops[0]), reached through forward (nil: a net.Dialer), for a listener
// that forwards (Policy.Hops). It sends that node a hello naming the hops
// after it, the listeners crossed so far, this one included, and, when
// the listener has a key (Policy.Key, which the nodes of a route share
// and prove to each other), the connection's origin. It returns once the
// rest of the route has accepted; a refusal comes back as a
// *RefusedError whose Hop counts from the next node. The caller relays
// the bytes of the accepted Conn and of the returned one unchanged.
func (h *Hello) DialNextHop(ctx context.Context, forward layer.ContextDialer) (net.Conn, error) {
	if len(h.Hops) == 0 || h.listener == nil {
		return nil, errors.New("vlink: DialNextHop: the hello names no next node")
	}
	if forward == nil {
		forward = &net.Dialer{}
	}
	next := h.Hops[0]
	c, err := forward.DialContext(ctx, "tcp", next)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{"tcp", next}, Err: err}
	}
	m := &message{hops: h.Hops[1:]}
	m.trail = append(append(make([]byte, 0, len(h.trail)+trailIDSize), h.trail...), h.listener.id[:]...)
	key := h.listener.cfg.Policy.Key
	if ap, ok := netconn.AddrPort(h.RemoteAddr); ok && key != nil {
		m.origin = ap.String()
	}
	if _, _, err := handshakeWithContext(ctx, c, m, key, channelBinding(c)); err != nil {
		c.Close()
		var re *RefusedError
		if errors.As(err, &re) {
			return nil, hopRefusal(re, h.Hops)
		}
		return nil, &net.OpError{Op: "dial", Net: "vlink", Source: c.LocalAddr(), Addr: addr{"tcp", next}, Err: err}
	}
	return c, nil
}

// hopRefusal numbers a refusal that came back through the first of
// path: the listener said how many nodes beyond it refused.
func hopRefusal(re *RefusedError, path []string) *RefusedError {
	out := *re
	out.Hop = re.Hop + 1
	out.HopAddr = ""
	if out.Hop <= len(path) {
		out.HopAddr = path[out.Hop-1]
	}
	return &out
}

// fwdTransport reaches the peer through the nodes of a stack's route
// layers: it dials the first through the factories and sends it the
// route hello naming the others, then the peer. What it returns carries
// the dialer's own hello to the peer, end to end.
type fwdTransport struct {
	next layer.ContextDialer // the factories
	vias []string            // the nodes, the first dialed first
	node string
	key  []byte
}

func (t *fwdTransport) DialContext(ctx context.Context, network, peer string) (net.Conn, error) {
	c, err := t.next.DialContext(ctx, network, t.vias[0])
	if err != nil {
		return nil, err
	}
	path := append(t.vias[:len(t.vias):len(t.vias)], peer)
	if _, _, err := handshakeWithContext(ctx, c, &message{hops: path[1:], node: t.node}, t.key, channelBinding(c)); err != nil {
		c.Close()
		var re *RefusedError
		if errors.As(err, &re) {
			err = hopRefusal(re, path)
		}
		return nil, &net.OpError{Op: "dial", Net: "vlink", Source: c.LocalAddr(), Addr: addr{network, t.vias[0]}, Err: err}
	}
	return c, nil
}

// vias returns the nodes r's route layers go through, the first dialed
// first, and the VLink peer's gateway: a stack with nothing to mirror
// and no Via makes its last node the gateway that forwards to the
// destination, as Via does.
func (r *route) vias() (vias []string, via string, err error) {
	routes := r.stack.routes()
	for i := len(routes) - 1; i >= 0; i-- {
		spec, v, err := routes[i].build()
		if err != nil {
			return nil, "", err
		}
		rt, ok := v.(layer.Route)
		if !ok {
			return nil, "", fmt.Errorf("layer %s: registered as a route but is not one", spec.Name)
		}
		vias = append(vias, rt.Via())
	}
	via = r.via
	if via == "" && len(vias) > 0 && len(r.stack.mirrored()) == 0 {
		via, vias = vias[len(vias)-1], vias[:len(vias)-1]
	}
	for i, v := range vias {
		if slices.Contains(vias[:i], v) || v == via {
			return nil, "", fmt.Errorf("%w: the route names %s twice", ErrLoop, v)
		}
	}
	return vias, via, nil
}

// Through returns s going through nodes first, the first reached first:
// a fwd layer per node, below the route layers s has. The fwd layer must
// be registered (import github.com/vlink-dev/vlink/filters/fwd, or
// vlink/layers). vlink tunnel --via A,B,C is Stack.Through("A", "B") with
// C as the gateway.
func (s Stack) Through(nodes ...string) (Stack, error) {
	if len(nodes) == 0 {
		return s, nil
	}
	if spec := lookup("fwd"); spec == nil || spec.Kind != layer.KindRoute {
		return Stack{}, fmt.Errorf("%w: going through other nodes needs the fwd layer: import github.com/vlink-dev/vlink/filters/fwd (or vlink/layers)", ErrUnknownLayer)
	}
	above := len(s.mirrored()) + len(s.routes())
	layers := append([]Layer(nil), s.Layers[:above]...)
	for i := len(nodes) - 1; i >= 0; i-- {
		layers = append(layers, Layer{Name: "fwd", Params: map[string]string{"via": nodes[i]}})
	}
	layers = append(layers, s.Layers[above:]...)
	out := Stack{Layers: layers}
	if err := out.validate(""); err != nil {
		return Stack{}, err
	}
	return out, nil
}

package layer

import (
	"context"
	"fmt"
	"net"
)

// Kind says where a layer sits in a stack and what it does.
type Kind uint8

const (
	// KindFactory layers make the byte stream that reaches the next hop.
	// They sit at the bottom of a stack and implement [Factory].
	KindFactory Kind = iota + 1
	// KindFilter layers transform one byte stream into another and are
	// mirrored by the peer. They implement [Filter].
	KindFilter
	// KindMultiLink layers build one stream out of several connections of
	// the layer below, or many streams over one. They are mirrored by the
	// peer and implement [MultiLink].
	KindMultiLink
	// KindRoute layers reach the peer through another node, which
	// forwards the stream (a chain of them crosses a chain of nodes).
	// They sit between the mirrored layers and the factories, are not
	// mirrored, and implement [Route].
	KindRoute
)

func (k Kind) String() string {
	switch k {
	case KindFactory:
		return "factory"
	case KindFilter:
		return "filter"
	case KindMultiLink:
		return "multi-link"
	case KindRoute:
		return "route"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Mirrored reports whether the peer rebuilds layers of this kind from the
// hello: filters and multi-link layers are mirrored, factories are not.
func (k Kind) Mirrored() bool { return k == KindFilter || k == KindMultiLink }

// A ContextDialer dials a connection. Every layer reaches the wire only
// through the ContextDialer of the layer below it, as in
// golang.org/x/net/proxy. *vlink.Dialer and *net.Dialer implement it.
type ContextDialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// A Factory makes the byte stream to address. A terminal factory (tcp)
// reaches the network itself and is handed a nil forward; any other
// factory reaches its own next hop (a proxy, an SSH server) through forward.
type Factory interface {
	DialContext(ctx context.Context, network, address string, forward ContextDialer) (net.Conn, error)
}

// A CongestionControlled factory makes its connections' TCP senders use
// a congestion control algorithm (tcp's cc parameter): a dialer whose
// stack's factories hold one asks the listener, in its hello, to use the
// same on its side, so that both directions of a transfer do.
type CongestionControlled interface {
	// CongestionControl names the algorithm; "" for the system's default.
	CongestionControl() string
}

// A ListenFactory is a Factory that can also accept connections. Like
// DialContext, Listen reaches its next hop (the SSH server whose side
// listens, say) through forward; a terminal factory gets a nil forward.
type ListenFactory interface {
	Factory
	Listen(ctx context.Context, network, address string, forward ContextDialer) (net.Listener, error)
}

// A Route names the node a route layer goes through: that node forwards
// the stream to the next one, or to the peer, as the hello names them.
// The mirrored layers above a route run end to end, so the nodes on the
// way carry their bytes (compressed, encrypted) without reading them.
type Route interface {
	Via() string // the node's VLink listener, host:port
}

// A Filter transforms a byte stream; the peer applies the same filter on its
// side. Client wraps the dialing side's connection, Server the accepting
// side's. The returned connection owns c: closing it closes c.
type Filter interface {
	Client(c net.Conn) (net.Conn, error)
	Server(c net.Conn) (net.Conn, error)
}

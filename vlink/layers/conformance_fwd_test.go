package layers_test

import (
	"context"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// fwd is tested through a forwarding node on loopback, as vlink serve
// --hop runs one: the pipe's stack crosses it to reach the listener, and
// the identity layer above the route runs end to end.
func init() {
	fixtures["fwd"] = func(t *testing.T) (vlink.Stack, bool) {
		return vlink.MustParse("identity+fwd:via=" + forwarder(t)), false
	}
}

// forwarder starts a node that carries connections on to the next node
// their hello names, and returns its address.
func forwarder(t *testing.T) string {
	lc := vlink.ListenConfig{
		// Plain refused: a hello slowed past the sniff timeout must not be
		// taken for a plain connection, which has nothing admitted.
		Policy: vlink.Policy{Hops: []selector.Rule{{Host: "127.0.0.1", Ports: "*"}}, Plain: vlink.PlainRefuse},
		Admit:  func(ctx context.Context, h *vlink.Hello) (any, error) { return h.DialNextHop(ctx, nil) },
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { netconn.Relay(c, c.(*vlink.Conn).Admitted().(net.Conn)) })
	return l.Addr().String()
}

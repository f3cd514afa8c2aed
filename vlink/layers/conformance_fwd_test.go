package layers_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// fwd is tested through a forwarding node on loopback, as vlink serve
// --hop runs one: the pipe's stack crosses it to reach the listener, and
// the identity layer above the route runs end to end.
func init() {
	fixtures["fwd"] = func(t *testing.T) vlink.Stack {
		return vlink.MustParse("identity+fwd:via=" + forwarder(t))
	}
}

// forwarder starts a node that carries connections on to the next node
// their hello names, and returns its address.
func forwarder(t *testing.T) string {
	lc := vlink.ListenConfig{
		Policy: vlink.Policy{Hops: []selector.Rule{{Host: "127.0.0.1", Ports: "*"}}},
		Admit:  func(ctx context.Context, h *vlink.Hello) (any, error) { return h.DialNextHop(ctx, nil) },
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.AcceptVLink()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				netconn.Relay(c, c.Admitted().(net.Conn))
			}()
		}
	}()
	return l.Addr().String()
}

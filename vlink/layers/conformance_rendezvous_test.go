package layers_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

// The factories that reach nodes are tested in a vlink network on
// loopback: a relay, a node "dialer" that accepts reverse connections,
// and a node "server" whose listener the pipes' vlink listener wraps.
func init() {
	for _, name := range []string{"reverse", "relay", "splice"} {
		venues[name] = nodeVenue
	}
}

func nodeVenue(t *testing.T) venue {
	networkKey := []byte("conformance network key")
	relay, err := control.NewRelay(control.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.Listen(context.Background(), "127.0.0.1:0", networkKey)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { relay.Serve(rl); close(served) }()
	t.Cleanup(func() { relay.Close(); <-served })
	node := func(name string) *control.Node {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := control.Connect(ctx, control.Config{Name: name, Key: vlink.NodeKey(networkKey, name), Relays: []string{rl.Addr().String()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	dialer, server := node("dialer"), node("server")
	back, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := dialer.ServeReverse(back); err != nil {
		t.Fatal(err)
	}
	return venue{
		listen: func() (net.Listener, string, error) {
			l, err := server.Listen(func(string, uint16) error { return nil })
			return l, "server.vlink.alt:7", err
		},
		network: dialer,
		targets: []selector.Rule{{Host: "localhost", Ports: "7", Action: selector.Direct}},
	}
}

package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var networkKey = []byte("0123456789abcdef-network-key")

// testRelay is a relay serving on a loopback port.
type testRelay struct {
	*Relay
	addr string
	done chan error
}

func startRelay(t *testing.T, cfg RelayConfig, addr string) *testRelay {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	r, err := NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := networkKey
	if cfg.Member != nil {
		key = nil // a relay with a certificate takes no network key
	}
	l, err := r.Listen(context.Background(), addr, key)
	if err != nil {
		t.Fatal(err)
	}
	tr := &testRelay{Relay: r, addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { tr.done <- r.Serve(l) }()
	t.Cleanup(tr.stop)
	return tr
}

func (tr *testRelay) stop() {
	tr.Close()
	<-tr.done
	tr.done <- net.ErrClosed // stop is idempotent
}

func connect(t *testing.T, relay, name string, mod ...func(*Config)) *Node {
	t.Helper()
	cfg := Config{Name: name, Key: vlink.NodeKey(networkKey, name), Relays: []string{relay}}
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

const (
	typeEcho  Type = 1
	typeReply Type = 2
	typeNote  Type = 3
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// echo makes n answer typeEcho with the SHA-256 of the payload.
func echo(n *Node) {
	n.Handle(typeEcho, func(m *Message) {
		sum := sha256.Sum256(m.Payload)
		m.Reply(context.Background(), typeReply, append([]byte(n.Name()+":"), sum[:]...))
	})
}

func TestSendReceive(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	got := make(chan *Message, 1)
	b.Handle(typeNote, func(m *Message) { got <- m })
	payload := bytes.Repeat([]byte("x"), MaxPayload)
	if err := a.Send(ctxT(t), "bob", typeNote, payload); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.From != "alice" || m.Via != "" || m.Type != typeNote || !bytes.Equal(m.Payload, payload) {
			t.Fatalf("got from %q via %q type %d, %d bytes", m.From, m.Via, m.Type, len(m.Payload))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("message not delivered")
	}
	if err := a.Send(ctxT(t), "bob", typeNote, make([]byte, MaxPayload+1)); err == nil {
		t.Fatal("an oversized payload was sent")
	}
}

func TestCooperation(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a := connect(t, r.addr, "alice")
	peers := []string{"bob", "carol", "dave"}
	for _, name := range peers {
		echo(connect(t, r.addr, name))
	}
	t.Run("scatter/gather", func(t *testing.T) {
		var want []Expect
		for _, p := range peers {
			want = append(want, Expect{From: p, Type: typeReply})
		}
		c := a.Cooperate(want...)
		for i := len(peers) - 1; i >= 0; i-- { // the replies' order is the expectations'
			if err := c.Send(ctxT(t), peers[i], typeEcho, []byte(peers[i])); err != nil {
				t.Fatal(err)
			}
		}
		replies, err := c.Wait(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range peers {
			sum := sha256.Sum256([]byte(p))
			if replies[i].From != p || !bytes.Equal(replies[i].Payload, append([]byte(p+":"), sum[:]...)) {
				t.Fatalf("reply %d from %s: %q", i, replies[i].From, replies[i].Payload)
			}
		}
		if !c.Finished() {
			t.Fatal("a complete cooperation is not finished")
		}
	})
	t.Run("no such node", func(t *testing.T) {
		// The replies that can come do: the gather returns them, with
		// why the missing one is missing.
		c := a.Cooperate(Expect{From: "nobody"}, Expect{From: "bob"}, Expect{From: "carol"})
		c.Send(ctxT(t), "nobody", typeEcho, nil)
		c.Send(ctxT(t), "bob", typeEcho, []byte("b"))
		c.Send(ctxT(t), "carol", typeEcho, []byte("c"))
		replies, err := c.Wait(ctxT(t))
		var de *DeliveryError
		if !errors.Is(err, ErrNoNode) || !errors.As(err, &de) || de.To != "nobody" {
			t.Fatalf("Wait = %v, want ErrNoNode for nobody", err)
		}
		var ge *GatherError
		if !errors.As(err, &ge) || len(ge.Errs) != 3 || ge.Errs[0] == nil || ge.Errs[1] != nil || ge.Errs[2] != nil {
			t.Fatalf("Wait = %v, want a GatherError for the first reply alone", err)
		}
		if replies[0] != nil || replies[1] == nil || replies[1].From != "bob" || replies[2] == nil || replies[2].From != "carol" {
			t.Fatalf("replies %v, want nothing from nobody, then bob's and carol's", replies)
		}
	})
	t.Run("no such node, anyone's reply", func(t *testing.T) {
		// An expectation from anyone cannot be told apart: the
		// cooperation fails.
		c := a.Cooperate(Expect{})
		c.Send(ctxT(t), "nobody", typeEcho, nil)
		if _, err := c.Wait(ctxT(t)); !errors.Is(err, ErrNoNode) {
			t.Fatalf("Wait = %v, want ErrNoNode", err)
		}
	})
	t.Run("timeout, poll, cancel", func(t *testing.T) {
		c := a.Cooperate(Expect{From: "bob", Type: typeNote}) // bob answers typeReply: never fills it
		c.Send(ctxT(t), "bob", typeEcho, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		replies, err := c.Wait(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || replies[0] != nil {
			t.Fatalf("Wait = %v, %v; want a deadline and no reply", replies, err)
		}
		if c.Finished() {
			t.Fatal("a timed-out wait ended the cooperation")
		}
		c.Cancel()
		if _, err := c.Wait(ctxT(t)); !errors.Is(err, context.Canceled) || !c.Finished() {
			t.Fatalf("Wait after Cancel = %v", err)
		}
	})
	t.Run("late reply after cancel reaches no one", func(t *testing.T) {
		got := make(chan *Message, 1)
		a.Handle(typeReply, func(m *Message) { got <- m })
		defer a.Handle(typeReply, nil)
		c := a.Cooperate()
		c.Cancel()
		c.Send(ctxT(t), "bob", typeEcho, nil)
		// The handler sees the stray reply: the cancelled cooperation does
		// not swallow it, and nothing else was filled.
		select {
		case m := <-got:
			if m.From != "bob" {
				t.Fatalf("stray reply from %s", m.From)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the late reply went nowhere")
		}
	})
}

func TestForward(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b, c := connect(t, r.addr, "alice"), connect(t, r.addr, "bob"), connect(t, r.addr, "carol")
	// bob delegates every request to carol, who answers the origin.
	b.Handle(typeEcho, func(m *Message) { m.Forward(context.Background(), "carol") })
	seen := make(chan *Message, 1)
	c.Handle(typeEcho, func(m *Message) {
		seen <- m
		m.Reply(context.Background(), typeReply, []byte("from carol"))
	})
	coop := a.Cooperate(Expect{Type: typeReply})
	if err := coop.Send(ctxT(t), "bob", typeEcho, []byte("q")); err != nil {
		t.Fatal(err)
	}
	replies, err := coop.Wait(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	m := <-seen
	if m.From != "alice" || m.Via != "bob" || string(m.Payload) != "q" {
		t.Fatalf("carol saw from %q via %q: %q", m.From, m.Via, m.Payload)
	}
	if replies[0].From != "carol" || string(replies[0].Payload) != "from carol" {
		t.Fatalf("alice got from %q: %q", replies[0].From, replies[0].Payload)
	}

	t.Run("forged origin refused", func(t *testing.T) {
		got := make(chan *Message, 2)
		c.Handle(typeNote, func(m *Message) { got <- m })
		// bob claims to forward a message of alice's that the relay
		// never delivered to him.
		forged := &Message{From: "alice", Type: typeNote, Payload: []byte("forged"), coop: 12345, node: b}
		if err := forged.Forward(ctxT(t), "carol"); err != nil {
			t.Fatal(err)
		}
		// The relay handles bob's frames in order: once bob's next
		// message reaches carol, the forged one was dropped.
		b.Send(ctxT(t), "carol", typeNote, []byte("honest"))
		select {
		case m := <-got:
			if string(m.Payload) != "honest" || m.From != "bob" {
				t.Fatalf("carol received %q from %s via %q", m.Payload, m.From, m.Via)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("nothing reached carol")
		}
	})
}

func TestLookup(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	adv := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.7:4000")}
	a := connect(t, r.addr, "alice")
	b := connect(t, r.addr, "bob", func(c *Config) { c.Advertise = adv })
	if !b.Observed().Addr().IsLoopback() {
		t.Fatalf("bob observed as %v", b.Observed())
	}
	// bob registered with his addresses: the relay has them by now.
	p, err := a.Lookup(ctxT(t), "bob")
	if err != nil {
		t.Fatal(err)
	}
	if !p.Online || len(p.Addrs) != 2 || p.Addrs[0] != b.Observed() || p.Addrs[1] != adv[0] {
		t.Fatalf("lookup bob = %+v, observed %v", p, b.Observed())
	}
	if p, err = a.Lookup(ctxT(t), "nobody"); err != nil || p.Online {
		t.Fatalf("lookup nobody = %+v, %v", p, err)
	}
	if got := r.Nodes(); len(got) != 2 || got[0].Name != "alice" || got[1].Name != "bob" {
		t.Fatalf("Nodes = %+v", got)
	}
}

// TestIdentity: a node proves its own name's key, or is not registered.
func TestIdentity(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	connect(t, r.addr, "alice")
	tests := []struct {
		name string
		key  []byte
	}{
		{"alice", vlink.NodeKey(networkKey, "bob")}, // bob's key, alice's name
		{"alice", vlink.NodeKey([]byte("another network's key!"), "alice")},
		{"mallory", networkKey}, // the network key is not a node key
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := Connect(ctx, Config{Name: tt.name, Key: tt.key, Relays: []string{r.addr}})
			if err == nil {
				n.Close()
				t.Fatal("registered")
			}
			if !errors.Is(err, vlink.ErrRefused) {
				t.Fatalf("Connect = %v, want a refusal", err)
			}
		})
	}
	if got := r.Nodes(); len(got) != 1 || got[0].Name != "alice" {
		t.Fatalf("Nodes = %+v", got)
	}
	t.Run("plain connection", func(t *testing.T) {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read = %d, %v; want the relay to close", n, err)
		}
	})
}

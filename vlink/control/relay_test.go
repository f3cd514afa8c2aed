package control

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink"
)

// TestRelayRestart: nodes re-register by themselves after the relay
// restarts, keep their handlers, and a send issued while they are cut
// off goes out once they are back.
func TestRelayRestart(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	echo(b)
	ask := func(ctx context.Context) error {
		c := a.Cooperate(Expect{From: "bob", Type: typeReply})
		defer c.Cancel()
		if err := c.Send(ctx, "bob", typeEcho, []byte("ping")); err != nil {
			return err
		}
		_, err := c.Wait(ctx)
		return err
	}
	if err := ask(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r.stop()
	start := time.Now()
	r2 := startRelay(t, RelayConfig{}, r.addr)
	// Until bob is back, the relay does not know him; retry until it does.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := ask(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNoNode) && !errors.Is(err, ErrDisconnected) {
			t.Fatalf("after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("back %v after the restart", time.Since(start).Round(time.Millisecond))
	if got := r2.Nodes(); len(got) != 2 {
		t.Fatalf("the new relay holds %+v", got)
	}
}

// TestSlowNode: a node that stops reading fills its own queue at the
// relay and nothing else: senders are told busy, the relay holds at
// most its queue's bound, other nodes keep talking.
func TestSlowNode(t *testing.T) {
	const queue = 64 << 10
	r := startRelay(t, RelayConfig{MaxQueue: queue}, "")
	a, c := connect(t, r.addr, "alice"), connect(t, r.addr, "carol")
	stuck := make(chan struct{})
	defer close(stuck)
	b := connect(t, r.addr, "bob", func(c *Config) { c.MaxHandlers = 1 })
	b.Handle(typeNote, func(*Message) { <-stuck })
	echo(c)
	payload := make([]byte, 32<<10)
	var busy error
	for i := 0; i < 10_000 && busy == nil; i++ {
		coop := a.Cooperate(Expect{})
		if err := coop.Send(ctxT(t), "bob", typeNote, payload); err != nil {
			t.Fatal(err)
		}
		select {
		case <-coop.Done():
			_, busy = coop.Wait(ctxT(t))
		case <-time.After(20 * time.Millisecond):
		}
		coop.Cancel()
	}
	if !errors.Is(busy, ErrBusy) {
		t.Fatalf("never told busy: %v", busy)
	}
	if n := r.budget.n.Load(); n > queue+int64(len(payload))+64 {
		t.Fatalf("the relay queues %d bytes, bound %d", n, queue)
	}
	co := a.Cooperate(Expect{From: "carol"})
	co.Send(ctxT(t), "carol", typeEcho, []byte("still there?"))
	if _, err := co.Wait(ctxT(t)); err != nil {
		t.Fatalf("carol, while bob is stuck: %v", err)
	}
}

// TestMalformedFrame: a node that sends a frame breaking the format is
// dropped, with nothing else disturbed.
func TestMalformedFrame(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a := connect(t, r.addr, "alice")
	echo(connect(t, r.addr, "bob"))
	tests := map[string][]byte{
		"bad version":      {9, 3, 0, 1, 0, 0, 0, 0},
		"unknown op":       {1, 99, 0, 0, 0, 0, 0, 0},
		"huge length":      {1, 3, 0, 1, 0xff, 0xff, 0xff, 0xff},
		"relay's op":       (&frame{op: opWelcome}).append(nil),
		"send to bad name": append((&frame{op: opSend, typ: 1, name: "x"}).append(nil)[:headerSize+9], 1, 'X'),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			d := vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Node: "mallory", Key: vlink.NodeKey(networkKey, "mallory")}
			c, err := d.DialContext(ctxT(t), "tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write((&frame{op: opAdvertise}).append(nil))
			if f, err := readFrame(c); err != nil || f.op != opWelcome {
				t.Fatalf("first frame %v, %v", f, err)
			}
			c.Write(in)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("the relay kept the connection")
				}
			}
			co := a.Cooperate(Expect{From: "bob"})
			co.Send(ctxT(t), "bob", typeEcho, []byte(name))
			if _, err := co.Wait(ctxT(t)); err != nil {
				t.Fatalf("alice to bob afterwards: %v", err)
			}
		})
	}
}

func TestFrameRoundTrip(t *testing.T) {
	f := &frame{op: opSend, typ: 5, coop: 1 << 60, name: "bob", payload: bytes.Repeat([]byte{7}, 100)}
	got, err := readFrame(bytes.NewReader(f.append(nil)))
	if err != nil || got.name != "bob" || got.coop != f.coop || !bytes.Equal(got.payload, f.payload) {
		t.Fatalf("%+v, %v", got, err)
	}
}

// TestMaxNodes: a relay full of nodes refuses the next one with the
// reason, and serves the registered ones as before.
func TestMaxNodes(t *testing.T) {
	r := startRelay(t, RelayConfig{MaxNodes: 2}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	echo(b)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := Connect(ctx, Config{Name: "carol", Key: vlink.NodeKey(networkKey, "carol"), Relays: []string{r.addr}})
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("a third node: %v, want ErrBusy", err)
	}
	co := a.Cooperate(Expect{From: "bob"})
	co.Send(ctxT(t), "bob", typeEcho, nil)
	if _, err := co.Wait(ctxT(t)); err != nil {
		t.Fatalf("alice to bob with the relay full: %v", err)
	}
}

// TestNoNodeNameClosed: a connection that proves the network key itself
// but no node name is closed before its first frame is read: it could
// otherwise register as the node "" and send as it, every node trusting
// the relay for who sent what.
func TestNoNodeNameClosed(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	d := vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Key: networkKey}
	c, err := d.DialContext(ctxT(t), "tcp", r.addr)
	if err != nil {
		t.Fatalf("the network key, no node name: the handshake itself passes (%v)", err)
	}
	defer c.Close()
	c.Write((&frame{op: opAdvertise}).append(nil))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := readFrame(c)
	if err == nil {
		t.Fatalf("the relay answered a connection that proved no node name with %s", f.op)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the relay kept a connection that proved no node name")
	}
	if nodes := r.Nodes(); len(nodes) != 0 {
		t.Errorf("the relay holds %+v", nodes)
	}
}

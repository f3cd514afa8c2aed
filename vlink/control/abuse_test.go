package control

import (
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink"
)

// rawNode registers name with the relay on a connection the test drives
// frame by frame: a node that does what no Node would.
func rawNode(t *testing.T, relay, name string) net.Conn {
	t.Helper()
	d := vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Node: name, Key: vlink.NodeKey(networkKey, name)}
	c, err := d.DialContext(ctxT(t), "tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.Write((&frame{op: opAdvertise}).append(nil))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if f, err := readFrame(c); err != nil || f.op != opWelcome {
		t.Fatalf("registering %s: %v, %v", name, f, err)
	}
	c.SetReadDeadline(time.Time{})
	return c
}

// TestAbuse: a registered node floods the relay, in each of the ways a
// hostile or broken node could; the relay's memory stays within its
// bounds, and the other nodes keep talking and connecting.
func TestAbuse(t *testing.T) {
	const queue = 64 << 10
	r := startRelay(t, RelayConfig{MaxQueue: queue}, "")
	alice, bob := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	echo(bob)
	paths := echoListener(t, bob, 7)

	flood := func(c net.Conn, f *frame, n int) {
		b := f.append(nil)
		batch := make([]byte, 0, 64*len(b))
		for range 64 {
			batch = append(batch, b...)
		}
		c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for i := 0; i < n; i += 64 {
			if _, err := c.Write(batch); err != nil {
				return // the relay may cut the flooder off: that is fine too
			}
		}
	}
	for _, tt := range []struct {
		name string
		do   func(t *testing.T)
	}{
		{"lookups, answers never read", func(t *testing.T) {
			flood(rawNode(t, r.addr, "m-lookup"), &frame{op: opLookup, coop: 1, name: "bob"}, 200_000)
		}},
		{"messages to a node", func(t *testing.T) {
			flood(rawNode(t, r.addr, "m-send"), &frame{op: opSend, typ: typeNote, name: "bob", payload: make([]byte, 1024)}, 20_000)
		}},
		{"dials never attached", func(t *testing.T) {
			c := rawNode(t, r.addr, "m-dial")
			for i := 0; i < 1000; i++ {
				f := &frame{op: opDial, coop: uint64(i + 1), name: "bob", port: 7, key: make([]byte, keySize)}
				rand.Read(f.token[:])
				if _, err := c.Write(f.append(nil)); err != nil {
					return
				}
			}
			// The relay holds at most maxPendingPerNode of them.
			time.Sleep(100 * time.Millisecond)
			r.mu.Lock()
			n := len(r.pending)
			r.mu.Unlock()
			if n > maxPendingPerNode {
				t.Errorf("the relay holds %d set-ups for one node, bound %d", n, maxPendingPerNode)
			}
		}},
		{"reverse addresses of another host", func(t *testing.T) {
			// A dial naming another host to be connected back at: bob is
			// sent to mallory's own address (loopback here), at the port
			// named, never to the host named.
			back, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer back.Close()
			c := rawNode(t, r.addr, "m-reverse")
			f := &frame{op: opDial, coop: 1, name: "bob", port: 7, key: make([]byte, keySize),
				addrs: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(back.Addr().(*net.TCPAddr).Port))}}
			rand.Read(f.token[:])
			c.Write(f.append(nil))
			back.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
			bc, err := back.Accept()
			if err != nil {
				t.Fatalf("bob did not connect back to mallory's own address: %v", err)
			}
			bc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if got, err := readFrame(bc); err != nil || got.op != opAttach || got.token != f.token {
				t.Fatalf("bob's connection back: %v, %v", got, err)
			}
			bc.Close()
		}},
		{"registrations", func(t *testing.T) {
			// Each registration replaces the one before: one entry.
			for range 200 {
				c := rawNode(t, r.addr, "m-register")
				c.Close()
			}
			waitFor(t, func() bool {
				for _, n := range r.Nodes() {
					if n.Name == "m-register" {
						return false
					}
				}
				return true
			})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.do(t)
			if n, bound := r.budget.n.Load(), int64(3*queue); n > bound {
				t.Errorf("the relay queues %d bytes, more than the nodes' three queues (%d)", n, bound)
			}
			co := alice.Cooperate(Expect{From: "bob"})
			co.Send(ctxT(t), "bob", typeEcho, []byte(tt.name))
			if _, err := co.Wait(ctxT(t)); err != nil {
				t.Fatalf("alice to bob afterwards: %v", err)
			}
			c, err := alice.DialPaths(ctxT(t), "bob", 7, PathRelay)
			if err != nil {
				t.Fatalf("alice's connection to bob afterwards: %v", err)
			}
			defer c.Close()
			<-paths
			echoThrough(t, c)
		})
	}
}

// TestReverseTokenOnce: a reverse connection's token opens one
// connection; the same token again, or a guessed one, is turned away.
// (The test plays the dial: it answers attached on the connection the
// token brought.)
func TestReverseTokenOnce(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a := connect(t, r.addr, "alice")
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ServeReverse(rl); err != nil {
		t.Fatal(err)
	}
	var token [tokenSize]byte
	rand.Read(token[:])
	waiting := &reverseWait{conn: make(chan pathConn, 1), done: make(chan struct{})}
	defer close(waiting.done)
	a.mu.Lock()
	a.reverse[token] = waiting
	a.mu.Unlock()
	try := func(tok [tokenSize]byte) error {
		c, err := net.Dial("tcp", rl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return attachOn(ctxT(t), c, tok)
	}
	go func() {
		c := <-waiting.conn
		c.Write((&frame{op: opAttached}).append(nil))
		c.Close()
	}()
	if err := try(token); err != nil {
		t.Fatalf("the first connection with the token: %v", err)
	}
	var guessed [tokenSize]byte
	rand.Read(guessed[:])
	for name, tok := range map[string][tokenSize]byte{"again": token, "guessed": guessed} {
		if err := try(tok); err == nil {
			t.Errorf("a connection with a %s token was attached", name)
		}
	}
}

// TestPendingEndsWithNode: when a node leaves the relay, the connections
// being set up to or from it end at once, not at their timeout: the
// node it dialed frees what it held for them, and a node dialing it
// hears that it went offline.
func TestPendingEndsWithNode(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	bob := connect(t, r.addr, "bob")
	echoListener(t, bob, 7)
	held := func() int {
		bob.mu.Lock()
		defer bob.mu.Unlock()
		return bob.listener.from["mallory"]
	}

	// mallory's dials, never attached, hold bob's offers until mallory
	// leaves.
	m := rawNode(t, r.addr, "mallory")
	for i := range maxOffersPerNode {
		f := &frame{op: opDial, coop: uint64(i + 1), name: "bob", port: 7, key: make([]byte, keySize)}
		rand.Read(f.token[:])
		m.Write(f.append(nil))
	}
	waitFor(t, func() bool { return held() == maxOffersPerNode })
	m.Close()
	start := time.Now()
	waitFor(t, func() bool { return held() == 0 })
	if took := time.Since(start); took > RendezvousTimeout/2 {
		t.Fatalf("bob held mallory's offers %v after mallory left", took)
	}

	// carol asks for a connection to dave, who leaves before answering.
	carol := connect(t, r.addr, "carol")
	dave := connect(t, r.addr, "dave")
	asked, release := make(chan struct{}), make(chan struct{})
	if _, err := dave.Listen(func(string, uint16) error { close(asked); <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	dialed := make(chan error, 1)
	go func() {
		_, err := carol.DialPaths(ctxT(t), "dave", 7, PathRelay)
		dialed <- err
	}()
	<-asked
	start = time.Now()
	closed := make(chan struct{})
	go func() { dave.Close(); close(closed) }() // it waits for the allow below
	err := <-dialed
	took := time.Since(start)
	close(release)
	<-closed
	if !errors.Is(err, ErrNoNode) {
		t.Fatalf("carol's dial to dave, who left: %v, want ErrNoNode", err)
	}
	if took > RendezvousTimeout/2 {
		t.Fatalf("carol heard %v after dave left", took)
	}
}

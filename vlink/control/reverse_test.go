package control

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// echoListener exposes port on n and echoes what each connection sends,
// reporting the path each came by.
func echoListener(t *testing.T, n *Node, port uint16) <-chan string {
	t.Helper()
	l, err := n.Listen(exposes(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	paths := make(chan string, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			paths <- c.(*Conn).Path()
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return paths
}

func echoThrough(t *testing.T, c net.Conn) {
	t.Helper()
	data := make([]byte, 1<<20)
	rand.Read(data)
	go func() { c.Write(data); c.(*Conn).CloseWrite() }()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo: %d of %d bytes intact (%v)", len(got), len(data), err)
	}
}

// TestReverseConn: a dialer that accepts reverse connections is
// connected back to by the node it dials; the relay carries nothing.
func TestReverseConn(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	paths := echoListener(t, b, 7)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ServeReverse(rl); err != nil {
		t.Fatal(err)
	}

	// A stranger's connection with a made-up token is turned away.
	stranger, err := net.Dial("tcp", rl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var tok [tokenSize]byte
	rand.Read(tok[:])
	stranger.Write((&frame{op: opAttach, token: tok}).append(nil))
	stranger.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := stranger.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("a made-up token got %d bytes, %v", n, err)
	}
	stranger.Close()

	c, err := a.DialNode(ctxT(t), "bob", 7)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.(*Conn).Path(); p != "reverse" {
		t.Fatalf("alice's end came by %q, want reverse", p)
	}
	if p := <-paths; p != "reverse" {
		t.Fatalf("bob's end came by %q, want reverse", p)
	}
	echoThrough(t, c)
	if n := r.Relayed(); n != 0 {
		t.Fatalf("the relay carries %d connections", n)
	}
	waitFor(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.pending) == 0 })

	a.Close()
	if c, err := net.Dial("tcp", rl.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the reverse port still accepts after the node closed")
	}
}

// TestReverseFallback: when the dialer cannot be reached back, the
// relay carries the connection, as soon as it joins the race: after
// relayStagger, not after the reverse attempt's bound (no splicing: on
// loopback it would work).
func TestReverseFallback(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	paths := echoListener(t, b, 7)
	silentReverse(t, a)
	start := time.Now()
	c, err := a.DialPaths(ctxT(t), "bob", 7, PathReverse|PathRelay)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	took := time.Since(start)
	if p := c.Path(); p != "relay" || <-paths != "relay" {
		t.Fatalf("came by %q, want relay", p)
	}
	if took < relayStagger || took >= reverseTimeout {
		t.Fatalf("the fallback took %v, want the relay's stagger (%v) and less than the reverse attempt's bound (%v)", took, relayStagger, reverseTimeout)
	}
	echoThrough(t, c)
}

// silentReverse has n offer a reverse port that accepts and never
// answers, what a middlebox that swallows the connection looks like, and
// returns how many connections it took.
func silentReverse(t *testing.T, n *Node) *atomic.Int32 {
	t.Helper()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var taken atomic.Int32
	testnet.Serve(t, silent, func(c net.Conn) {
		taken.Add(1)
		io.Copy(io.Discard, c) // until the other end gives up
	})
	n.mu.Lock()
	n.reversePorts = []uint16{uint16(silent.Addr().(*net.TCPAddr).Port)}
	n.mu.Unlock()
	return &taken
}

// TestReverseAddrs: the relay sends a node back only to the address it
// saw the dialer come from, whatever addresses the dialer names.
func TestReverseAddrs(t *testing.T) {
	a := &peer{observed: netip.MustParseAddrPort("198.51.100.7:40000")}
	got := reverseAddrs(a, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.5:22"), netip.MustParseAddrPort("0.0.0.0:7200"), netip.MustParseAddrPort("0.0.0.0:7200")})
	want := []netip.AddrPort{netip.MustParseAddrPort("198.51.100.7:22"), netip.MustParseAddrPort("198.51.100.7:7200")}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("reverseAddrs = %v, want %v", got, want)
	}
	if got := reverseAddrs(&peer{}, want); got != nil {
		t.Fatalf("with no observed address: %v", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
	}
}

// TestDialPaths: a dial takes only the paths it allows, and says why
// when none of them works.
func TestDialPaths(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	alice, bob, carol := connect(t, r.addr, "alice"), connect(t, r.addr, "bob"), connect(t, r.addr, "carol")
	paths := echoListener(t, bob, 7)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.ServeReverse(rl); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name  string
		from  *Node
		paths Paths
		want  string // the path taken, or "" for an error
		err   error
	}{
		{"any, reverse accepted", alice, PathsAny, "reverse", nil},
		{"reverse only", alice, PathReverse, "reverse", nil},
		{"relay only, though reverse is accepted", alice, PathRelay, "relay", nil},
		{"any, no reverse accepted", carol, PathsAny, "splice", nil},
		{"splice only", alice, PathSplice, "splice", nil},
		{"reverse or relay, no reverse accepted", carol, PathReverse | PathRelay, "relay", nil},
		{"reverse only, none accepted", carol, PathReverse, "", ErrNoReverse},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.from.DialPaths(ctxT(t), "bob", 7, tt.paths)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("DialPaths = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got, theirs := c.Path(), <-paths; got != tt.want || theirs != tt.want {
				t.Fatalf("came by %q (bob's end: %q), want %q", got, theirs, tt.want)
			}
			echoThrough(t, c)
		})
	}

	t.Run("reverse only, node cannot connect back", func(t *testing.T) {
		// alice's reverse port is closed: bob cannot connect back, and
		// must not take the relay instead.
		closed := testnet.RefusedPort(t)
		dave := connect(t, r.addr, "dave")
		dave.mu.Lock()
		dave.reversePorts = []uint16{uint16(closed)}
		dave.mu.Unlock()
		// The connections of the cases above are closed; the relay ends
		// its side of theirs in its own time.
		waitFor(t, func() bool { return r.Relayed() == 0 })
		start := time.Now()
		c, err := dave.DialPaths(ctxT(t), "bob", 7, PathReverse)
		var de *DeliveryError
		if !errors.Is(err, ErrUnreachable) || !errors.As(err, &de) || !strings.Contains(de.Reason, "could not connect back to dave") {
			t.Fatalf("DialPaths = %v, %v; want ErrUnreachable saying bob could not connect back", c, err)
		}
		if took := time.Since(start); took > reverseTimeout+5*time.Second {
			t.Fatalf("the refusal took %v", took)
		}
		if n := r.Relayed(); n != 0 {
			t.Fatalf("the relay carries %d connections", n)
		}
		waitFor(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.pending) == 0 })
	})
}

// TestNoRelayAttach: the relay refuses to carry a connection whose
// dialer kept it off the relay, even when the node dialed attaches.
func TestNoRelayAttach(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	alice, bob := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	offered, release := make(chan struct{}), make(chan struct{})
	l, err := bob.Listen(func(string, uint16) error {
		close(offered)
		<-release
		return errors.New("not now")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	coop := alice.Cooperate(Expect{Type: typeReady})
	defer coop.Cancel()
	dial := &frame{op: opDial, coop: coop.token, name: "bob", port: 7, key: make([]byte, keySize), flags: flagNoRelay,
		addrs: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:9")}}
	rand.Read(dial.token[:])
	if err := alice.send(ctxT(t), dial); err != nil {
		t.Fatal(err)
	}
	<-offered // the relay holds the rendezvous now
	// Were bob taken, alice would be told to come (ready); bob would
	// then wait for her, up to this context's end.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := bob.attach(ctx, dial.token)
	if err == nil {
		c.Close()
	}
	readied := coop.Finished()
	close(release)
	if err == nil || readied {
		t.Fatalf("bob's attach to a connection alice kept off the relay: %v; alice told to come: %v", err, readied)
	}
	if n := r.Relayed(); n != 0 {
		t.Fatalf("the relay carries %d connections", n)
	}
}

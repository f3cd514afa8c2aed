package control

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
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
	served := make(chan error, 1)
	go func() { served <- a.ServeReverse(rl) }()
	waitFor(t, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return len(a.reversePorts) == 1 })

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
	if err := <-served; err == nil {
		t.Fatal("ServeReverse returned no error after Close")
	}
}

// TestReverseFallback: when the dialer cannot be reached back, the
// relay carries the connection, within the reverse attempt's bound.
func TestReverseFallback(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	paths := echoListener(t, b, 7)
	// A port that accepts and never answers: what a middlebox that
	// swallows the connection looks like.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	a.mu.Lock()
	a.reversePorts = []uint16{uint16(silent.Addr().(*net.TCPAddr).Port)}
	a.mu.Unlock()
	start := time.Now()
	c, err := a.DialNode(ctxT(t), "bob", 7)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	took := time.Since(start)
	if p := c.(*Conn).Path(); p != "relay" || <-paths != "relay" {
		t.Fatalf("came by %q, want relay", p)
	}
	if took > reverseTimeout+5*time.Second {
		t.Fatalf("the fallback took %v", took)
	}
	echoThrough(t, c)
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

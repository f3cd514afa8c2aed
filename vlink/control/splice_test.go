package control

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// changePorts makes n look as if a NAT that changes ports were in the
// way of its control connection, and undoes it when the test ends.
func changePorts(t *testing.T, n *Node) {
	n.mu.Lock()
	was := n.local
	n.local = netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), n.observed.Port()+1)
	n.mu.Unlock()
	t.Cleanup(func() { n.mu.Lock(); n.local = was; n.mu.Unlock() })
}

// TestSplice: both nodes connect to each other at once; the relay
// carries nothing. Behind a NAT that changes ports the splice is not
// tried, and the dial says so at once (the dialer's NAT) or within the
// splice's bound (the node's), or falls back to the relay if allowed.
func TestSplice(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	alice, bob := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	paths := echoListener(t, bob, 7)

	t.Run("spliced", func(t *testing.T) {
		c, err := alice.DialPaths(ctxT(t), "bob", 7, PathSplice)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, theirs := c.Path(), <-paths; got != "splice" || theirs != "splice" {
			t.Fatalf("came by %q (bob's end: %q), want splice", got, theirs)
		}
		// One TCP connection between the two splice ports, none through
		// the relay.
		if c.LocalAddr().(Addr).Node != "alice" || r.Relayed() != 0 {
			t.Fatalf("local %v, relayed %d", c.LocalAddr(), r.Relayed())
		}
		tc := c.Conn.(*net.TCPConn)
		if tc.RemoteAddr().String() == r.addr {
			t.Fatal("the spliced connection goes to the relay")
		}
		echoThrough(t, c)
		waitFor(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.pending) == 0 })
	})

	t.Run("dialer behind a NAT that changes ports", func(t *testing.T) {
		changePorts(t, alice)
		start := time.Now()
		_, err := alice.DialPaths(ctxT(t), "bob", 7, PathSplice)
		if !errors.Is(err, ErrNATChangesPorts) {
			t.Fatalf("DialPaths = %v, want ErrNATChangesPorts", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("the refusal took %v, want at once", took)
		}
	})

	t.Run("node behind a NAT that changes ports", func(t *testing.T) {
		changePorts(t, bob)
		start := time.Now()
		_, err := alice.DialPaths(ctxT(t), "bob", 7, PathSplice)
		var de *DeliveryError
		if !errors.Is(err, ErrUnreachable) || !errors.As(err, &de) || !strings.Contains(de.Reason, "changes ports") {
			t.Fatalf("DialPaths = %v, want ErrUnreachable saying bob's NAT changes ports", err)
		}
		if took := time.Since(start); took > 2*spliceTimeout {
			t.Fatalf("the refusal took %v", took)
		}
		c, err := alice.DialPaths(ctxT(t), "bob", 7, PathSplice|PathRelay)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got, theirs := c.Path(), <-paths; got != "relay" || theirs != "relay" {
			t.Fatalf("came by %q (bob's end: %q), want relay", got, theirs)
		}
		echoThrough(t, c)
	})
}

// TestSpliceRendezvous drives the dialer's side frame by frame: the
// relay passes on only the punch of the node dialed and the sync of the
// dialer, once each, so a third node can neither redirect a splice nor
// start it early; the node dialed takes no connection but the one from
// the port it was told; and the roles come from the rendezvous (the node
// dialed proves the token, whoever connected).
func TestSpliceRendezvous(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	bob := connect(t, r.addr, "bob")
	paths := echoListener(t, bob, 7)
	alice := rawNode(t, r.addr, "alice")
	mallory := rawNode(t, r.addr, "mallory")

	la, err := (&net.ListenConfig{Control: reusePort}).Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	pA := uint16(la.Addr().(*net.TCPAddr).Port)
	dial := &frame{op: opDial, coop: 1, name: "bob", port: 7, key: make([]byte, keySize), flags: flagSplice | flagNoRelay,
		splice: netip.AddrPortFrom(netip.IPv4Unspecified(), pA)}
	rand.Read(dial.token[:])
	rand.Read(dial.key)
	alice.Write(dial.append(nil))
	alice.SetReadDeadline(time.Now().Add(10 * time.Second))
	punch, err := readFrame(alice)
	if err != nil || punch.op != opPunch || punch.token != dial.token {
		t.Fatalf("waiting for bob's punch: %v, %v", punch, err)
	}
	if punch.splice.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("bob's splice address %v: not where the relay saw bob", punch.splice)
	}

	// mallory, knowing the token, punches and syncs: the relay drops
	// both, so alice hears no other address and bob does not connect.
	mallory.Write((&frame{op: opPunch, token: dial.token, splice: netip.MustParseAddrPort("0.0.0.0:9")}).append(nil))
	mallory.Write((&frame{op: opSync, token: dial.token}).append(nil))
	alice.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if f, err := readFrame(alice); err == nil {
		t.Fatalf("alice got %s after mallory's punch", f.op)
	}
	la.(*net.TCPListener).SetDeadline(time.Now().Add(300 * time.Millisecond))
	if c, err := la.Accept(); err == nil {
		c.Close()
		t.Fatal("bob connected before alice's sync: mallory's sync went through")
	}

	// A connection to bob's splice port from any other port is not his:
	// bob closes it and keeps trying alice's port, which refuses him for
	// a while, until alice listens there again.
	stranger, err := net.Dial("tcp", punch.splice.String())
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	la.Close()
	alice.Write((&frame{op: opSync, token: dial.token}).append(nil))
	stranger.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := stranger.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stranger's connection to bob's splice port: %d bytes, %v; want it closed", n, err)
	}
	time.Sleep(100 * time.Millisecond)
	la, err = (&net.ListenConfig{Control: reusePort}).Listen(context.Background(), "tcp4", la.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	la.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	c, err := la.Accept()
	if err != nil {
		t.Fatalf("bob did not connect after the sync: %v", err)
	}
	defer c.Close()
	if got := unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()); got != punch.splice {
		t.Fatalf("bob connected from %v, not the port he punched (%v)", got, punch.splice)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(c)
	if err != nil || f.op != opAttach || f.token != dial.token {
		t.Fatalf("bob's first frame: %v, %v; want attach with the token", f, err)
	}
	c.Write((&frame{op: opAttached}).append(nil))
	if p := <-paths; p != "splice" {
		t.Fatalf("bob's end came by %q", p)
	}
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := c.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo on the spliced connection: %q, %v", buf, err)
	}
	waitFor(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.pending) == 0 })
}

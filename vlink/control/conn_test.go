package control

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// exposes lets dialers reach the listed ports.
func exposes(ports ...uint16) func(string, uint16) error {
	return func(from string, port uint16) error {
		for _, p := range ports {
			if p == port {
				return nil
			}
		}
		return fmt.Errorf("port %d is not exposed", port)
	}
}

func TestRelayedConn(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	l, err := b.Listen(exposes(5432))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const size = 8 << 20
	up, down := make([]byte, size), make([]byte, size)
	rand.Read(up)
	rand.Read(down)

	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		if got := c.(*Conn).VouchedPeer(); got != "alice" {
			served <- fmt.Errorf("bob's end says the peer is %q", got)
			return
		}
		// The write must end before the deferred Close: a Close in the
		// middle of it would cut the stream, the test's own doing.
		wrote := make(chan error, 1)
		go func() {
			_, err := c.Write(down)
			if err == nil {
				err = netconn.CloseWrite(c)
			}
			wrote <- err
		}()
		got, err := io.ReadAll(c)
		if err == nil && !bytes.Equal(got, up) {
			err = fmt.Errorf("bob read %d bytes, sha256 %x; want %d, %x", len(got), sha256.Sum256(got), size, sha256.Sum256(up))
		}
		if werr := <-wrote; err == nil {
			err = werr
		}
		served <- err
	}()
	nc, err := a.DialNode(ctxT(t), "bob", 5432)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := nc.(*Conn)
	if c.VouchedPeer() != "bob" || !bytes.Equal(c.VouchedKey(), c.key) || len(c.VouchedKey()) != keySize || c.RemoteAddr().String() != "bob.vlink.alt:5432" {
		t.Fatalf("alice's end: peer %q, remote %v", c.VouchedPeer(), c.RemoteAddr())
	}
	go func() { c.Write(up); c.CloseWrite() }()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, down) {
		t.Fatalf("alice read %d bytes (%v), want %d intact", len(got), err, size)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}

	t.Run("refused port", func(t *testing.T) {
		_, err := a.DialNode(ctxT(t), "bob", 22)
		var de *DeliveryError
		if !errors.Is(err, ErrRefused) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &de) || de.Reason != "port 22 is not exposed" {
			t.Fatalf("DialNode = %v, want ErrRefused with bob's reason", err)
		}
	})
	t.Run("no such node", func(t *testing.T) {
		if _, err := a.DialNode(ctxT(t), "nobody", 1); !errors.Is(err, ErrNoNode) {
			t.Fatalf("DialNode = %v, want ErrNoNode", err)
		}
	})
	t.Run("node without a listener", func(t *testing.T) {
		if _, err := b.DialNode(ctxT(t), "alice", 1); !errors.Is(err, ErrRefused) {
			t.Fatalf("DialNode = %v, want ErrRefused", err)
		}
	})
}

// TestRendezvousToken: a token works once, for the two nodes it was made
// for; anyone else holding it, or using it again, gets nothing.
func TestRendezvousToken(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b, m := connect(t, r.addr, "alice"), connect(t, r.addr, "bob"), connect(t, r.addr, "mallory")
	asked := make(chan struct{})
	release := make(chan struct{})
	l, _ := b.Listen(func(string, uint16) error {
		close(asked)
		<-release
		return nil
	})
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	dialed := make(chan error, 1)
	var conn net.Conn
	go func() {
		var err error
		conn, err = a.DialNode(ctxT(t), "bob", 80)
		dialed <- err
	}()
	<-asked
	var token [tokenSize]byte
	r.mu.Lock()
	for tok := range r.pending {
		token = tok
	}
	r.mu.Unlock()
	if _, err := m.attach(ctxT(t), token); err == nil {
		t.Fatal("mallory attached with a token made for alice and bob")
	}
	close(release)
	if err := <-dialed; err != nil {
		t.Fatalf("alice, after mallory's try: %v", err)
	}
	defer conn.Close()
	conn.Write([]byte("echo"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "echo" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	for _, n := range []*Node{a, b} {
		if _, err := n.attach(ctxT(t), token); err == nil {
			t.Fatalf("%s attached again with a used token", n.Name())
		}
	}
}

// TestRelayedAbort: when the relay dies mid-stream, each end sees an
// error, never a clean end of stream.
func TestRelayedAbort(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	l, _ := b.Listen(exposes(1))
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c
		}
	}()
	c, err := a.DialNode(ctxT(t), "bob", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bc := <-accepted
	defer bc.Close()
	c.Write([]byte("x"))
	io.ReadFull(bc, make([]byte, 1))
	r.stop()
	for name, conn := range map[string]net.Conn{"alice": c, "bob": bc} {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.ReadAll(conn)
		if err == nil {
			t.Errorf("%s read a clean end of stream after the relay died", name)
		}
	}
}

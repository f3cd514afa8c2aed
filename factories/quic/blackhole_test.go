package quic

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// udpRelay forwards datagrams between one client and target until drop
// is set, then swallows them all: a path gone black. Before, it loses
// loss datagrams in a thousand, each way.
type udpRelay struct {
	pc   net.PacketConn
	drop atomic.Bool
	loss atomic.Int32 // per mille
}

// lost reports whether to lose a datagram.
func (r *udpRelay) lost() bool {
	return r.drop.Load() || rand.Int32N(1000) < r.loss.Load()
}

func newUDPRelay(t *testing.T, target string) *udpRelay {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up, err := net.Dial("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	r := &udpRelay{pc: pc}
	var client atomic.Pointer[net.Addr]
	go func() { // client -> target
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				up.Close()
				return
			}
			client.Store(&from)
			if !r.lost() {
				up.Write(buf[:n])
			}
		}
	}()
	go func() { // target -> client
		buf := make([]byte, 64<<10)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if c := client.Load(); c != nil && !r.lost() {
				pc.WriteTo(buf[:n], *c)
			}
		}
	}()
	t.Cleanup(func() { pc.Close() })
	return r
}

// TestBlackHole: when the path stops carrying datagrams, both ends'
// streams fail with quic-go's idle timeout error within the idle
// timeout, a reader never sees a clean end, and a new dial makes a new
// path.
func TestBlackHole(t *testing.T) {
	const idle = time.Second
	f := newFactory(t, Options{IdleTimeout: idle})
	l := listen(t, f)
	r := newUDPRelay(t, l.Addr().String())
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	a, err := f.DialContext(context.Background(), "tcp", r.pc.LocalAddr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := <-acc
	defer b.Close()
	checkEcho(t, a, b)

	r.drop.Store(true)
	start := time.Now()
	type res struct {
		err error
		at  time.Duration
	}
	ends := make(chan res, 2)
	for _, c := range []net.Conn{a, b} {
		go func() {
			_, err := io.Copy(io.Discard, c)
			ends <- res{err, time.Since(start)}
		}()
	}
	go a.Write([]byte("lost on the way"))
	for range 2 {
		e := <-ends
		var ie *quic.IdleTimeoutError
		if !errors.As(e.err, &ie) {
			t.Fatalf("a read on the black-holed path ended with %v, want the idle timeout", e.err)
		}
		// The idle timeout, plus the time quic-go gives retransmissions
		// (up to three PTOs).
		if e.at > 3*idle {
			t.Errorf("the idle timeout fired after %v, want about %v", e.at, idle)
		}
	}
	r.drop.Store(false)
	c, err := f.DialContext(context.Background(), "tcp", r.pc.LocalAddr().String(), nil)
	if err != nil {
		t.Fatalf("a dial after the path broke: %v", err)
	}
	d := <-acc2(l)
	defer d.Close()
	defer c.Close()
	checkEcho(t, c, d)
}

func acc2(l net.Listener) chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		ch <- c
	}()
	return ch
}

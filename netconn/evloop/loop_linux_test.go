package evloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/internal/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Handler that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	dialed []error
	ended  []ended
	refuse bool
	done   chan struct{} // gets a value per Ended or failed Dialed
}

type ended struct {
	up, down int64
	err      error
	aborted  bool
}

func newRecorder() *recorder { return &recorder{done: make(chan struct{}, 1000)} }

func (r *recorder) Accepted(*Conn) bool { return !r.refuse }

func (r *recorder) Dialed(_ *Conn, _ time.Duration, err error) {
	r.mu.Lock()
	r.dialed = append(r.dialed, err)
	r.mu.Unlock()
	if err != nil {
		r.done <- struct{}{}
	}
}

func (r *recorder) Ended(c *Conn, err error) {
	r.mu.Lock()
	r.ended = append(r.ended, ended{c.Up, c.Down, err, c.Aborted})
	r.mu.Unlock()
	r.done <- struct{}{}
}

// wait returns the outcome of the next connection to end.
func (r *recorder) wait(t *testing.T) ended {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection ended")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ended) == 0 {
		return ended{err: r.dialed[len(r.dialed)-1]}
	}
	e := r.ended[0]
	r.ended = r.ended[1:]
	return e
}

// startLoop serves a loop in front of target, closed and aborted at the
// end of the test.
func startLoop(t *testing.T, target netip.AddrPort, r *recorder, timeout time.Duration) *Loop {
	t.Helper()
	return listenLoop(t, Config{Target: target, DialTimeout: timeout}, r)
}

// listenLoop serves a loop with cfg, closed and aborted at the end of the
// test.
func listenLoop(t *testing.T, cfg Config, r Handler) *Loop {
	t.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	lp, err := Listen(l, cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lp.Close()
		lp.Abort()
		<-lp.Done()
	})
	return lp
}

// serve runs f with each connection a new listener accepts
// (testnet.Serve).
func serve(t *testing.T, f func(c *net.TCPConn)) netip.AddrPort {
	t.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { f(c.(*net.TCPConn)) })
	return l.Addr().(*net.TCPAddr).AddrPort()
}

func dial(t *testing.T, lp *Loop) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, lp.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantReset checks that a client sees a reset: at its first read, or,
// on loopback where the reset can come first, as its dial's error.
func wantReset(t *testing.T, lp *Loop) {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, lp.Addr().(*net.TCPAddr))
	if err == nil {
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("client: %v, want a reset", err)
	}
}

// TestRelay carries short and bulk streams both ways and checks what
// arrives, its end, and the counts Ended reports.
func TestRelay(t *testing.T) {
	for _, tc := range []struct {
		name     string
		up, down int // bytes each way
	}{
		{"one byte answer", 0, 1},
		{"short both ways", 100, 3000},
		{"bulk down", 10, 8 << 20}, // moves to the splicing relay
		{"bulk up", 8 << 20, 10},   // the other way
		{"bulk both ways", 3 << 20, 3 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, down := testnet.RandomBytes(tc.up, 1), testnet.RandomBytes(tc.down, 2)
			gotUp := make(chan []byte, 1)
			target := serve(t, func(c *net.TCPConn) {
				wrote := make(chan struct{})
				go func() {
					defer close(wrote)
					c.Write(down)
					c.CloseWrite()
				}()
				b, _ := io.ReadAll(c)
				gotUp <- b
				<-wrote
			})
			r := newRecorder()
			lp := startLoop(t, target, r, 0)
			c := dial(t, lp)
			go func() {
				c.Write(up)
				c.CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("client read: %v", err)
			}
			if testnet.Sum(got) != testnet.Sum(down) {
				t.Errorf("client got %d bytes (%s), want %d (%s)", len(got), testnet.Sum(got), len(down), testnet.Sum(down))
			}
			if b := <-gotUp; !bytes.Equal(b, up) {
				t.Errorf("target got %d bytes, want %d", len(b), len(up))
			}
			e := r.wait(t)
			if e.err != nil || e.up != int64(tc.up) || e.down != int64(tc.down) {
				t.Errorf("Ended: up %d down %d err %v, want %d %d nil", e.up, e.down, e.err, tc.up, tc.down)
			}
		})
	}
}

// TestHalfClose: an end passes through while the other way goes on.
func TestHalfClose(t *testing.T) {
	target := serve(t, func(c *net.TCPConn) {
		req, _ := io.ReadAll(c) // to the client's end
		c.Write(append([]byte("got "), req...))
	})
	r := newRecorder()
	lp := startLoop(t, target, r, 0)
	c := dial(t, lp)
	c.Write([]byte("ping"))
	c.CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "got ping" {
		t.Fatalf("got %q, %v; want \"got ping\"", got, err)
	}
	if e := r.wait(t); e.err != nil {
		t.Errorf("Ended: %v", e.err)
	}
}

// TestReset: a target that resets mid-stream resets the client, whose
// read fails instead of ending cleanly, short or bulk.
func TestReset(t *testing.T) {
	for _, n := range []int{100, 1 << 20} {
		target := serve(t, func(c *net.TCPConn) {
			c.Write(testnet.RandomBytes(n, 3))
			time.Sleep(50 * time.Millisecond)
			c.SetLinger(0)
		})
		r := newRecorder()
		lp := startLoop(t, target, r, 0)
		c := dial(t, lp)
		got, err := io.ReadAll(c)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%d bytes: client read %d bytes and %v, want a reset", n, len(got), err)
		}
		if e := r.wait(t); !errors.Is(e.err, syscall.ECONNRESET) {
			t.Errorf("%d bytes: Ended: %v, want a reset", n, e.err)
		}
	}
}

// TestDialFailure: a target that refuses, or does not answer within
// DialTimeout, resets the client.
func TestDialFailure(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		closed := l.Addr().(*net.TCPAddr).AddrPort()
		l.Close()
		r := newRecorder()
		lp := startLoop(t, closed, r, 0)
		wantReset(t, lp)
		if e := r.wait(t); !errors.Is(e.err, syscall.ECONNREFUSED) {
			t.Errorf("Dialed: %v, want ECONNREFUSED", e.err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		full := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(testnet.UnansweredPort(t)))
		r := newRecorder()
		lp := startLoop(t, full, r, 300*time.Millisecond)
		start := time.Now()
		c := dial(t, lp)
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("client read: %v, want a reset", err)
		}
		if e := r.wait(t); !errors.Is(e.err, os.ErrDeadlineExceeded) {
			t.Errorf("Dialed: %v, want a timeout", e.err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the reset took %v, DialTimeout is 300ms", took)
		}
	})
}

// TestAbortAndClose: Close frees the port and lets connections finish;
// Abort resets them, in the loop and in the splicing relay.
func TestAbortAndClose(t *testing.T) {
	release := make(chan struct{})
	target := serve(t, func(c *net.TCPConn) {
		var kind [1]byte
		io.ReadFull(c, kind[:])
		c.Write([]byte("hello"))
		if kind[0] == 'b' {
			c.Write(make([]byte, 256<<10)) // moves to the splicing relay
		}
		<-release
	})
	r := newRecorder()
	lp := startLoop(t, target, r, 0)
	short, bulk := dial(t, lp), dial(t, lp)
	short.Write([]byte("s"))
	bulk.Write([]byte("b"))
	for _, c := range []*net.TCPConn{short, bulk} {
		if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
	}
	addr := lp.Addr().String()
	lp.Close()
	if l, err := net.Listen("tcp", addr); err != nil {
		t.Errorf("the port is not free after Close: %v", err)
	} else {
		l.Close()
	}
	if _, err := io.ReadFull(bulk, make([]byte, 256<<10)); err != nil {
		t.Fatalf("after Close a connection goes on: %v", err)
	}
	lp.Abort()
	for _, c := range []*net.TCPConn{short, bulk} {
		if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("after Abort: %v, want a reset", err)
		}
	}
	for range 2 {
		if e := r.wait(t); !e.aborted || !errors.Is(e.err, ErrAborted) {
			t.Errorf("Ended: %v, aborted %v", e.err, e.aborted)
		}
	}
	close(release)
	select {
	case <-lp.Done():
	case <-time.After(5 * time.Second):
		t.Error("the loop did not end once closed and empty")
	}
}

// TestRefused: a connection the Handler refuses is reset.
func TestRefused(t *testing.T) {
	target := serve(t, func(c *net.TCPConn) { t.Error("a refused connection reached the target") })
	r := newRecorder()
	r.refuse = true
	lp := startLoop(t, target, r, 0)
	wantReset(t, lp)
}

// TestResetIdle: a side that resets while both ways wait, or after its
// own end, resets the other side, which never reads a clean end.
func TestResetIdle(t *testing.T) {
	for _, tc := range []struct {
		name              string
		targetResets      bool
		resetterEndsFirst bool
	}{
		{"client resets", false, false},
		{"target resets", true, false},
		{"client resets after its end", false, true},
		{"target resets after its end", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			targets := make(chan *net.TCPConn, 1)
			done := make(chan struct{})
			target := serve(t, func(c *net.TCPConn) {
				targets <- c
				<-done
			})
			defer close(done)
			r := newRecorder()
			lp := startLoop(t, target, r, 0)
			client := dial(t, lp)
			tc0 := <-targets
			resetter, peer := client, tc0
			if tc.targetResets {
				resetter, peer = tc0, client
			}
			// The loop carries a byte both ways, then both wait.
			for _, p := range [][2]*net.TCPConn{{client, tc0}, {tc0, client}} {
				p[0].Write([]byte{1})
				if _, err := io.ReadFull(p[1], make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.resetterEndsFirst {
				resetter.CloseWrite()
				if n, err := peer.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					t.Fatalf("peer read %d, %v; want the end", n, err)
				}
			}
			time.Sleep(20 * time.Millisecond)
			resetter.SetLinger(0)
			resetter.Close()
			if tc.resetterEndsFirst {
				// The peer read the end of a whole stream: the kernel
				// tells it of the reset at its next write (EPIPE).
				var err error
				for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); {
					_, err = peer.Write([]byte{2})
					time.Sleep(10 * time.Millisecond)
				}
				if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("peer's write: %v, want a reset", err)
				}
			} else {
				peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("peer: %v, want a reset", err)
				}
			}
			if e := r.wait(t); !errors.Is(e.err, syscall.ECONNRESET) && !errors.Is(e.err, syscall.EPIPE) {
				t.Errorf("Ended: %v, want a reset", e.err)
			}
		})
	}
}

// TestMany runs connections of every kind at once, short and bulk, ended
// whole or reset by either side: each client reads its bytes whole and a
// clean end only when the target ended cleanly, a reset otherwise, and a
// target whose client reset fails instead of writing on forever.
func TestMany(t *testing.T) {
	const (
		whole       = iota // the target sends its bytes and ends
		targetReset        // the target sends half and resets
		clientReset        // the client reads half and resets
	)
	sizes := []int{1, 100, 5000, 70000, 1 << 20}
	targetErrs := make(chan error, 1000)
	target := serve(t, func(c *net.TCPConn) {
		var hdr [5]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			targetErrs <- err
			return
		}
		kind, n := int(hdr[0]), int(uint32(hdr[1])<<24|uint32(hdr[2])<<16|uint32(hdr[3])<<8|uint32(hdr[4]))
		data := testnet.RandomBytes(n, uint64(n))
		switch kind {
		case whole:
			_, err := c.Write(data)
			c.CloseWrite()
			targetErrs <- err
		case targetReset:
			c.Write(data[:n/2])
			time.Sleep(5 * time.Millisecond)
			c.SetLinger(0)
			targetErrs <- nil
		case clientReset:
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			var err error
			for err == nil {
				_, err = c.Write(data)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				targetErrs <- errors.New("the target wrote on for 10 s to a client that reset")
				return
			}
			targetErrs <- nil
		}
	})
	r := newRecorder()
	lp := startLoop(t, target, r, 0)
	var wg sync.WaitGroup
	for i := range 150 {
		kind, n := i%3, sizes[(i/3)%len(sizes)]
		if kind == clientReset && n < 5000 {
			n = 1 << 20 // enough to still be writing when the client resets
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTCP("tcp", nil, lp.Addr().(*net.TCPAddr))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.Write([]byte{byte(kind), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			switch kind {
			case whole:
				got, err := io.ReadAll(c)
				if err != nil || testnet.Sum(got) != testnet.Sum(testnet.RandomBytes(n, uint64(n))) {
					t.Errorf("whole %d bytes: got %d, %v", n, len(got), err)
				}
			case targetReset:
				got, err := io.ReadAll(c)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("target reset after %d of %d bytes: client read %d and %v, want a reset", n/2, n, len(got), err)
				}
			case clientReset:
				io.ReadFull(c, make([]byte, n/2))
				c.SetLinger(0)
			}
		}()
	}
	wg.Wait()
	for range 150 {
		select {
		case err := <-targetErrs:
			if err != nil {
				t.Error("target:", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a target never finished")
		}
	}
}

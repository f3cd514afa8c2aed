package vio_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vio"
	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// wait returns the set's next event, failing the test after 10 s.
func wait(t testing.TB, s *vio.Set) vio.Event {
	t.Helper()
	ev, err := s.Wait(10 * time.Second)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return ev
}

func newSet(t testing.TB) *vio.Set {
	s := vio.NewSet()
	t.Cleanup(func() { s.Close() })
	return s
}

func add(t testing.TB, s *vio.Set, c net.Conn) *vio.Sock {
	t.Helper()
	k, err := s.Add(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestReadMinMax: a read completes once its minimum has come, with what
// came beyond it up to the buffer's size, and the progress callback has
// seen every partial count first.
func TestReadMinMax(t *testing.T) {
	s := newSet(t)
	a, b := tcpPair(t)
	k := add(t, s, a)
	buf := make([]byte, 10)
	var seen int
	if err := k.PostRead(buf, 4, func(n int) { seen += n }); err != nil {
		t.Fatal(err)
	}
	b.Write([]byte("ab"))
	if ev, err := s.Wait(50 * time.Millisecond); err == nil {
		t.Fatalf("a read of at least 4 bytes completed with 2: %+v", ev)
	}
	b.Write([]byte("cdef"))
	ev := wait(t, s)
	if ev.Op != vio.OpRead || ev.Sock != k || ev.Err != nil || ev.N < 4 || ev.N > 6 || seen != ev.N {
		t.Fatalf("event %+v, progress saw %d: want a read of 4 to 6 bytes, all seen", ev, seen)
	}
	if got := string(buf[:ev.N]); got != "abcdef"[:ev.N] {
		t.Errorf("read %q", got)
	}
}

// TestReadEnd: the peer's end before the minimum is io.ErrUnexpectedEOF,
// with what came; the next read gets io.EOF.
func TestReadEnd(t *testing.T) {
	s := newSet(t)
	a, b := tcpPair(t)
	k := add(t, s, a)
	b.Write([]byte("xy"))
	b.Close()
	buf := make([]byte, 8)
	k.PostRead(buf, 4, nil)
	ev := wait(t, s)
	var oe *vio.OpError
	if !errors.Is(ev.Err, io.ErrUnexpectedEOF) || !errors.As(ev.Err, &oe) || oe.Op != vio.OpRead || ev.N != 2 || string(buf[:2]) != "xy" {
		t.Fatalf("event %+v (%v): want 2 bytes and io.ErrUnexpectedEOF in an *OpError", ev, ev.Err)
	}
	k.PostRead(buf, 1, nil)
	if ev := wait(t, s); !errors.Is(ev.Err, io.EOF) || ev.N != 0 {
		t.Fatalf("event %+v: want io.EOF", ev)
	}
}

// TestVectored sends a header and a payload from two buffers in one
// writev, and reads them into two buffers.
func TestVectored(t *testing.T) {
	s := newSet(t)
	a, b := tcpPair(t)
	ka, kb := add(t, s, a), add(t, s, b)
	header, payload := []byte("HDR:0042"), testnet.RandomBytes(1<<20, 1)
	if err := ka.PostWritev(net.Buffers{header, payload}, nil); err != nil {
		t.Fatal(err)
	}
	gotH, gotP := make([]byte, len(header)), make([]byte, len(payload))
	var progress int
	if err := kb.PostReadv([][]byte{gotH, gotP}, func(n int) { progress += n }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ev := wait(t, s)
		if ev.Err != nil || ev.N != len(header)+len(payload) {
			t.Fatalf("event %+v", ev)
		}
	}
	if !bytes.Equal(gotH, header) || sha256.Sum256(gotP) != sha256.Sum256(payload) || progress != len(header)+len(payload) {
		t.Fatalf("the vectored read differs from what was written (progress %d)", progress)
	}
}

// TestCloseInterrupts: PostClose ends a blocked read and a blocked
// write, which complete with net.ErrClosed, before the close completes.
func TestCloseInterrupts(t *testing.T) {
	s := newSet(t)
	a, _ := tcpPair(t) // the peer never reads nor writes
	k := add(t, s, a)
	k.PostRead(make([]byte, 10), 1, nil)
	k.PostWrite(make([]byte, 64<<20), nil) // more than the socket buffers hold
	if _, err := s.Wait(50 * time.Millisecond); !errors.Is(err, vio.ErrTimeout) {
		t.Fatalf("Wait: %v, want nothing completed yet", err)
	}
	if err := k.PostClose(); err != nil {
		t.Fatal(err)
	}
	ops := map[vio.Op]bool{}
	for range 3 {
		ev := wait(t, s)
		if ev.Op == vio.OpClose {
			if len(ops) != 2 || ev.Err != nil {
				t.Fatalf("the close completed (%v) before the read and write it interrupted: %v", ev.Err, ops)
			}
			continue
		}
		if !errors.Is(ev.Err, net.ErrClosed) {
			t.Errorf("%v: %v, want net.ErrClosed", ev.Op, ev.Err)
		}
		ops[ev.Op] = true
	}
	if err := k.PostRead(make([]byte, 1), 1, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a read posted after the close: %v, want net.ErrClosed", err)
	}
	if err := k.PostClose(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a second close: %v, want net.ErrClosed", err)
	}
}

func TestPostRefused(t *testing.T) {
	s := newSet(t)
	a, _ := tcpPair(t)
	k := add(t, s, a)
	for _, tc := range []struct {
		name string
		post func() error
		want error
	}{
		{"minimum above the buffer", func() error { return k.PostRead(make([]byte, 4), 5, nil) }, vio.ErrInvalid},
		{"minimum 0", func() error { return k.PostRead(make([]byte, 4), 0, nil) }, vio.ErrInvalid},
		{"empty readv", func() error { return k.PostReadv([][]byte{nil, {}}, nil) }, vio.ErrInvalid},
		{"empty write", func() error { return k.PostWrite(nil, nil) }, vio.ErrInvalid},
		{"read", func() error { return k.PostRead(make([]byte, 4), 1, nil) }, nil},
		{"second read", func() error { return k.PostRead(make([]byte, 4), 1, nil) }, vio.ErrBusy},
		{"a write beside the read", func() error { return k.PostWrite([]byte("x"), nil) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.post(); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestWaitTimeoutAndWakeup: Wait's timeout is os.ErrDeadlineExceeded;
// a Wakeup from another goroutine ends a blocked Wait, once for any
// number of Wakeups.
func TestWaitTimeoutAndWakeup(t *testing.T) {
	s := newSet(t)
	start := time.Now()
	if _, err := s.Wait(30 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("Wait(30ms): %v after %v", err, time.Since(start))
	}
	if _, err := s.Wait(0); !errors.Is(err, vio.ErrTimeout) {
		t.Fatalf("Wait(0): %v", err)
	}
	done := make(chan error)
	go func() {
		_, err := s.Wait(-1)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	s.Wakeup()
	if err := <-done; !errors.Is(err, vio.ErrWoken) {
		t.Fatalf("a woken Wait: %v", err)
	}
	// Wakeups before a Wait wake it once. (Two Wakeups while a Wait is
	// blocked may wake it and the next one: it can take the first before
	// the second comes.)
	s.Wakeup()
	s.Wakeup()
	if _, err := s.Wait(0); !errors.Is(err, vio.ErrWoken) {
		t.Fatalf("a Wait after two Wakeups: %v", err)
	}
	if _, err := s.Wait(0); !errors.Is(err, vio.ErrTimeout) {
		t.Fatalf("two Wakeups woke two Waits: %v", err)
	}
}

// TestSetClose: closing the set ends a blocked Wait and what is posted.
func TestSetClose(t *testing.T) {
	s := vio.NewSet()
	a, _ := tcpPair(t)
	k := add(t, s, a)
	k.PostRead(make([]byte, 1), 1, nil)
	done := make(chan error)
	for range 3 { // every blocked Wait returns, not one
		go func() {
			_, err := s.Wait(-1)
			done <- err
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Wait on a closed set: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a Wait blocked when the set closed still waits")
		}
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the set's close left the connection open: %v", err)
	}
	if _, err := s.Add(a, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Add to a closed set: %v", err)
	}
}

// TestOneGoroutineManyConnections: an echo server of one goroutine
// serves 20 clients at once, over TCP and over a vlink zstd stack, and
// each gets its bytes back intact.
func TestOneGoroutineManyConnections(t *testing.T) {
	for _, stack := range []string{"tcp", "zstd"} {
		t.Run(stack, func(t *testing.T) {
			st := vlink.MustParse(stack)
			l, err := vlinkListen(vlink.ListenConfig{}) // mirrors the stack the dialer asks for
			if err != nil {
				t.Fatal(err)
			}
			echoServer(t, l)
			d := vlink.Dialer{Stack: st}
			errs := make(chan error, 20)
			for i := range 20 {
				go func() {
					c, err := d.Dial("tcp", l.Addr().String())
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(20 * time.Second))
					data := testnet.RandomBytes(200<<10, uint64(i))
					go c.Write(data)
					got := make([]byte, len(data))
					if _, err := io.ReadFull(c, got); err != nil {
						errs <- err
						return
					}
					if sha256.Sum256(got) != sha256.Sum256(data) {
						errs <- errors.New("echo differs")
						return
					}
					errs <- nil
				}()
			}
			for range 20 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

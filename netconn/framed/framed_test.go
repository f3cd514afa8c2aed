package framed_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn/framed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A below is the connection pair under two toy layers: loopback TCP
// (buffered, half-closes, resets), or net.Pipe (unbuffered: a write
// waits for the peer's read; no half-close).
type below struct {
	name string
	pair func(t *testing.T) (net.Conn, net.Conn)
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	a, b := testnet.TCPPair(t)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

var belows = []below{
	{"tcp", tcpPair},
	{"pipe", func(t *testing.T) (net.Conn, net.Conn) {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	}},
}

type result struct {
	got []byte
	err error
}

// readAll reads c to its end in the background, for at most 10 s.
func readAll(c net.Conn) <-chan result {
	ch := make(chan result, 1)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		got, err := io.ReadAll(c)
		ch <- result{got, err}
	}()
	return ch
}

// TestCloseSendsEnd: Close, with no Write in progress, returns at once
// even though the peer does not read yet; the end marker follows the
// bytes, and the peer reads them all, then io.EOF; then the connection
// below is closed.
func TestCloseSendsEnd(t *testing.T) {
	for _, bl := range belows {
		t.Run(bl.name, func(t *testing.T) {
			a, b := bl.pair(t)
			ta, tb := newToy(a, false), newToy(b, false)
			data := testnet.RandomBytes(200<<10, 1)
			wrote := make(chan error, 1)
			go func() { _, err := ta.Write(data); wrote <- err }()
			got := make([]byte, len(data))
			if _, err := io.ReadFull(tb, got); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("peer read %d bytes (sha256 %s), %v; want %s", len(got), testnet.Sum(got), err, testnet.Sum(data))
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			// The peer reads nothing now: over a pipe the end marker cannot
			// go before it does.
			start := time.Now()
			if err := ta.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("Close took %v: it waited for the peer", d)
			}
			if r := <-readAll(tb); r.err != nil || len(r.got) != 0 {
				t.Fatalf("peer read %d more bytes, then %v; want io.EOF", len(r.got), r.err)
			}
			b.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := b.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("the connection below after the end: %v, want it closed (io.EOF)", err)
			}
			tb.Close()
		})
	}
}

// TestCloseDuringWriteCuts: a Close while a Write is blocked (the peer
// does not read) does not wait for it and sends no end marker: the Write
// fails with net.ErrClosed and the peer reads an error, not io.EOF.
func TestCloseDuringWriteCuts(t *testing.T) {
	for _, bl := range belows {
		t.Run(bl.name, func(t *testing.T) {
			a, b := bl.pair(t)
			ta, tb := newToy(a, false), newToy(b, false)
			data := testnet.RandomBytes(32<<20, 2) // more than the socket buffers hold
			wrote := make(chan error, 1)
			go func() { _, err := ta.Write(data); wrote <- err }()
			// The first byte read: the Write runs, and blocks on what the
			// peer does not read.
			if _, err := io.ReadFull(tb, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			closed := make(chan error, 1)
			go func() { closed <- ta.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close waits for the Write in progress")
			}
			select {
			case err := <-wrote:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("the Write Close cut short: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not unblock the Write")
			}
			r := <-readAll(tb)
			switch {
			case r.err == nil:
				t.Fatalf("peer read %d of %d bytes, then a clean end; want an error", len(r.got)+1, len(data))
			case errors.Is(r.err, os.ErrDeadlineExceeded):
				t.Fatalf("peer read %d of %d bytes, then nothing for 10 s; want an error", len(r.got)+1, len(data))
			case !errors.Is(r.err, syscall.ECONNRESET):
				t.Fatalf("peer: %v, want an error matching ECONNRESET (framed.ErrReset)", r.err)
			}
			t.Logf("peer read %d of %d bytes, then %v", len(r.got)+1, len(data), r.err)
			tb.Close()
		})
	}
}

// TestAbort: Abort sends no end marker, and aborts the connection below
// (a TCP connection is reset), or, for a layer with an abort marker,
// sends that: the peer reads what was written, then an error matching
// ECONNRESET, never io.EOF.
func TestAbort(t *testing.T) {
	for _, bl := range belows {
		for _, marker := range []bool{false, true} {
			name := bl.name
			if marker {
				name += "/marker"
			}
			t.Run(name, func(t *testing.T) {
				a, b := bl.pair(t)
				ta, tb := newToy(a, marker), newToy(b, false)
				wrote := make(chan error, 1)
				go func() { _, err := ta.Write([]byte("some bytes")); wrote <- err }()
				got := make([]byte, 10)
				if _, err := io.ReadFull(tb, got); err != nil || string(got) != "some bytes" {
					t.Fatalf("peer read %q, %v", got, err)
				}
				if err := <-wrote; err != nil {
					t.Fatal(err)
				}
				read := readAll(tb)
				if err := ta.Abort(); err != nil {
					t.Fatalf("Abort: %v", err)
				}
				r := <-read
				if len(r.got) != 0 || r.err == nil || !errors.Is(r.err, syscall.ECONNRESET) {
					t.Fatalf("peer read %d more bytes, then %v; want an error matching ECONNRESET", len(r.got), r.err)
				}
				switch {
				case marker && !errors.Is(r.err, framed.ErrReset) || marker && errors.Is(r.err, io.ErrUnexpectedEOF):
					t.Errorf("peer: %v, want the abort marker's framed.ErrReset", r.err)
				case !marker && bl.name == "tcp" && errors.Is(r.err, framed.ErrReset):
					t.Errorf("peer: %v, want the kernel's reset of the connection below", r.err)
				case !marker && bl.name == "pipe" && !errors.Is(r.err, framed.ErrNoEnd):
					t.Errorf("peer: %v, want framed.ErrNoEnd", r.err)
				}
				if err := ta.Close(); !errors.Is(err, net.ErrClosed) {
					t.Errorf("Close after Abort: %v, want net.ErrClosed", err)
				}
				tb.Close()
			})
		}
	}
}

// TestCloseWriteThenClose: CloseWrite ends this side's stream (the peer
// reads io.EOF after the bytes), half-closes the connection below where
// it can, and leaves the other way open; a later Close ends the rest
// cleanly.
func TestCloseWriteThenClose(t *testing.T) {
	for _, bl := range belows {
		t.Run(bl.name, func(t *testing.T) {
			a, b := bl.pair(t)
			ta, tb := newToy(a, false), newToy(b, false)
			read := readAll(tb)
			if _, err := ta.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if err := ta.CloseWrite(); err != nil {
				t.Fatalf("CloseWrite: %v", err)
			}
			if err := ta.CloseWrite(); err != nil {
				t.Fatalf("second CloseWrite: %v", err)
			}
			if r := <-read; r.err != nil || string(r.got) != "ping" {
				t.Fatalf("peer read %q, %v; want \"ping\", then io.EOF", r.got, r.err)
			}
			_, err := ta.Write([]byte("x"))
			if !errors.Is(err, net.ErrClosed) || !errors.Is(err, syscall.EPIPE) || !errors.Is(err, framed.ErrWriteShut) {
				t.Errorf("Write after CloseWrite: %v, want framed.ErrWriteShut (net.ErrClosed, EPIPE)", err)
			}
			if bl.name == "tcp" {
				// Behind the end marker, the FIN of the half-close.
				b.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := b.Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("the connection below after CloseWrite: %v, want its half-close (io.EOF)", err)
				}
			}
			back := readAll(ta)
			go func() {
				tb.Write([]byte("pong"))
				tb.CloseWrite()
			}()
			if r := <-back; r.err != nil || string(r.got) != "pong" {
				t.Fatalf("read %q, %v the other way; want \"pong\", then io.EOF", r.got, r.err)
			}
			if err := ta.Close(); err != nil {
				t.Errorf("Close after CloseWrite: %v", err)
			}
			if err := tb.Close(); err != nil {
				t.Errorf("peer's Close: %v", err)
			}
		})
	}
}

// TestUseAfterClose: Close unblocks a pending Read; then every call is
// net.ErrClosed in a *net.OpError naming the layer, and so is a second
// Close.
func TestUseAfterClose(t *testing.T) {
	a, b := tcpPair(t)
	ta, tb := newToy(a, false), newToy(b, false)
	defer tb.Close()
	pending := make(chan error, 1)
	go func() { _, err := ta.Read(make([]byte, 10)); pending <- err }()
	time.Sleep(20 * time.Millisecond)
	if err := ta.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-pending:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("pending Read: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock a pending Read")
	}
	for _, tc := range []struct {
		op  string
		err error
	}{
		{"Close", ta.Close()},
		{"Abort", ta.Abort()},
		{"CloseWrite", ta.CloseWrite()},
		{"Write", func() error { _, err := ta.Write([]byte("x")); return err }()},
		{"Read", func() error { _, err := ta.Read(make([]byte, 1)); return err }()},
	} {
		var oe *net.OpError
		if !errors.Is(tc.err, net.ErrClosed) || !errors.As(tc.err, &oe) || oe.Net != "toy" {
			t.Errorf("%s after Close: %v, want net.ErrClosed in a *net.OpError naming toy", tc.op, tc.err)
		}
	}
	if ta.released.Load() == 0 {
		t.Error("the read buffers were not released")
	}
}

// stuck is a connection whose peer never reads: a Write blocks until a
// write deadline is set, which fires at once (the test does not wait for
// it), and the deadline is recorded.
type stuck struct {
	net.Conn // the addresses
	mu       sync.Mutex
	deadline time.Time
	set      chan struct{} // closed when a write deadline is set
	closed   chan struct{}
	once     sync.Once
}

func (s *stuck) Write(p []byte) (int, error) {
	select {
	case <-s.set:
		return 0, os.ErrDeadlineExceeded
	case <-s.closed:
		return 0, net.ErrClosed
	}
}

func (s *stuck) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !t.IsZero() && s.deadline.IsZero() {
		s.deadline = t
		close(s.set)
	}
	return nil
}

func (s *stuck) SetReadDeadline(time.Time) error { return nil }
func (s *stuck) Close() error                    { s.once.Do(func() { close(s.closed) }); return nil }

// TestLingerBounded: the end marker a Close sends to a peer that never
// reads is given framed.CloseLinger, not forever: then the connection
// below is closed.
func TestLingerBounded(t *testing.T) {
	a, _ := tcpPair(t)
	s := &stuck{Conn: a, set: make(chan struct{}), closed: make(chan struct{})}
	ta := newToy(s, false)
	start := time.Now()
	if err := ta.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.closed:
	case <-time.After(5 * time.Second):
		s.Close()
		t.Fatal("the connection below is still open: the end marker's write has no deadline")
	}
	s.mu.Lock()
	linger := s.deadline.Sub(start)
	s.mu.Unlock()
	if linger < framed.CloseLinger-time.Second || linger > framed.CloseLinger+time.Second {
		t.Fatalf("the end marker's write was given %v, want framed.CloseLinger (%v)", linger, framed.CloseLinger)
	}
}

// TestDrainAfterPeerEnd: a side that read the peer's end marker, answered
// and closed must not leave the bytes of the layer below's own end
// unread: closing a socket with unread bytes makes the kernel reset the
// connection and throw away what it had not sent yet, so the peer would
// lose the end of the answer.
func TestDrainAfterPeerEnd(t *testing.T) {
	for _, closeWrite := range []bool{false, true} {
		name := "close"
		if closeWrite {
			name = "closewrite"
		}
		t.Run(name, func(t *testing.T) {
			// Small buffers: the answer is still on its way when the
			// server closes.
			a, b := testnet.TCPPairBuffers(t, 16<<10, 64<<10)
			t.Cleanup(func() { a.Close(); b.Close() })
			client, server := newToy(testnet.TrailerConn{TCPConn: a}, false), newToy(b, false)
			if _, err := client.Write([]byte("question")); err != nil {
				t.Fatal(err)
			}
			shut := make(chan error, 1)
			go func() { shut <- client.CloseWrite() }()
			if r := <-readAll(server); r.err != nil || string(r.got) != "question" {
				t.Fatalf("server read %q, %v", r.got, r.err)
			}
			answer := testnet.RandomBytes(4<<20, 7)
			done := make(chan error, 1)
			go func() {
				_, err := server.Write(answer)
				if closeWrite && err == nil {
					err = server.CloseWrite()
				}
				if cerr := server.Close(); err == nil {
					err = cerr
				}
				done <- err
			}()
			if err := <-shut; err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the trailer is in the server's socket, unread
			// The client reads all but the answer's last 100 KiB, which the
			// buffers hold, and waits: the server's Write returns and it
			// closes with them still on their way.
			head := len(answer) - 100<<10
			got := make([]byte, head)
			if _, err := io.ReadFull(client, got); err != nil {
				server.Abort()
				t.Fatalf("client read: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
			r := <-readAll(client)
			got = append(got, r.got...)
			if r.err != nil || !bytes.Equal(got, answer) {
				server.Abort()
				t.Errorf("client read %d of %d bytes of the answer: %v", len(got), len(answer), r.err)
			}
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
			client.Close()
		})
	}
}

// gateConn is a testnet.TrailerConn whose trailer (the end of the layer
// below) waits for open.
type gateConn struct {
	*net.TCPConn
	open chan struct{}
}

func (c gateConn) CloseWrite() error {
	<-c.open
	if _, err := c.TCPConn.Write([]byte("end of the layer below")); err != nil {
		return err
	}
	return c.TCPConn.CloseWrite()
}

// TestCloseBeforeEndBelow is TestDrainAfterPeerEnd with a Close that
// comes before the end of the layer below: it stops the tail reader
// (framed.Ends.PeerEnded) with the read deadline that wakes a Read, and
// must still read that end before it closes the connection below.
func TestCloseBeforeEndBelow(t *testing.T) {
	a, b := testnet.TCPPairBuffers(t, 16<<10, 64<<10)
	t.Cleanup(func() { a.Close(); b.Close() })
	open := make(chan struct{})
	client, server := newToy(gateConn{a, open}, false), newToy(b, false)
	defer client.Close()
	if _, err := client.Write([]byte("question")); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() { shut <- client.CloseWrite() }()
	if r := <-readAll(server); r.err != nil || string(r.got) != "question" {
		close(open)
		t.Fatalf("server read %q, %v", r.got, r.err)
	}
	answer := testnet.RandomBytes(4<<20, 7)
	done := make(chan error, 1)
	go func() {
		_, err := server.Write(answer)
		if cerr := server.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	// The client reads all but the answer's last 100 KiB, which the
	// buffers hold: the server's Write returns and it closes, then the end
	// of the layer below comes.
	head := len(answer) - 100<<10
	got := make([]byte, head)
	if _, err := io.ReadFull(client, got); err != nil {
		close(open)
		server.Abort()
		t.Fatalf("client read: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			close(open)
			t.Fatalf("server: %v", err)
		}
	case <-time.After(10 * time.Second):
		close(open)
		server.Abort()
		t.Fatal("the server's Write still runs with the last 100 KiB to go")
	}
	close(open)
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the trailer reaches the server's socket
	r := <-readAll(client)
	got = append(got, r.got...)
	if r.err != nil || !bytes.Equal(got, answer) {
		t.Errorf("client read %d of %d bytes of the answer: %v", len(got), len(answer), r.err)
	}
}

// goneConn stands for a layer below that learns only by reading that
// its peer is gone, as a mux stream reads its peer's close mark after its
// end record (filters/mux): once its Read has found its end, its writes
// fail with EPIPE.
type goneConn struct {
	net.Conn
	gone atomic.Bool
}

func (c *goneConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err == io.EOF {
		c.gone.Store(true)
	}
	return n, err
}

func (c *goneConn) Write(p []byte) (int, error) {
	if c.gone.Load() {
		return 0, &net.OpError{Op: "write", Net: "gone", Err: syscall.EPIPE}
	}
	return c.Conn.Write(p)
}

// TestPeerGoneBelow: once the layer has read the peer's end marker, the
// connection below is read on to its end, with no Read or Close of the
// layer's and whatever read deadline its caller set then. A layer below
// that learns only so that its peer is gone then fails its writes, and
// the layer's Write fails with it, rather than write on into a stream
// nobody reads: a mux stream under compression, whose peer half-closed,
// then aborted (issue 38).
func TestPeerGoneBelow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Time // the read deadline set after the end marker; zero for none
	}{
		{"no deadline", time.Time{}},
		{"a read deadline passed", time.Unix(1, 0)},
		{"a read deadline to come", time.Now().Add(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			tb := newToy(&goneConn{Conn: b}, false)
			defer tb.Close()
			go io.Copy(io.Discard, a) // the peer reads what tb writes
			// The peer's request and end marker; the end of the connection
			// below comes later.
			if _, err := a.Write([]byte("d\x00\x07request" + "e")); err != nil {
				t.Fatal(err)
			}
			if r := <-readAll(tb); r.err != nil || string(r.got) != "request" {
				t.Fatalf("read %q, %v; want \"request\", then io.EOF", r.got, r.err)
			}
			if !tc.deadline.IsZero() {
				if err := tb.SetReadDeadline(tc.deadline); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // it would stop a read below
			}
			wrote := make(chan error, 1)
			go func() {
				buf := make([]byte, 32<<10)
				for {
					if _, err := tb.Write(buf); err != nil {
						wrote <- err
						return
					}
				}
			}()
			time.Sleep(20 * time.Millisecond) // the writes go through
			ended := time.Now()
			if err := a.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-wrote:
				if !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("Write: %v, want the layer below's EPIPE", err)
				}
				t.Logf("Write failed %v after the end below: %v", time.Since(ended).Round(time.Millisecond), err)
			case <-time.After(5 * time.Second):
				t.Fatal("Write still runs 5s after the end below: nothing read it")
			}
		})
	}
}

// TestErrors: what the shared errors match.
func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		match, not []error
	}{
		{"ErrReset", framed.ErrReset, []error{syscall.ECONNRESET}, []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed}},
		{"ErrNoEnd", framed.ErrNoEnd, []error{framed.ErrReset, syscall.ECONNRESET, io.ErrUnexpectedEOF}, []error{io.EOF, net.ErrClosed}},
		{"ErrWriteShut", framed.ErrWriteShut, []error{net.ErrClosed, syscall.EPIPE}, []error{framed.ErrReset, syscall.ECONNRESET}},
		{"wrapped ErrReset", &net.OpError{Op: "read", Net: "x", Err: framed.ErrReset}, []error{framed.ErrReset, syscall.ECONNRESET}, []error{io.EOF}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, m := range tc.match {
				if !errors.Is(tc.err, m) {
					t.Errorf("%v does not match %v", tc.err, m)
				}
			}
			for _, m := range tc.not {
				if errors.Is(tc.err, m) {
					t.Errorf("%v matches %v", tc.err, m)
				}
			}
		})
	}
}

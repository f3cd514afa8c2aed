package mux

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xtaci/smux"
	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/factories/tcp"
	_ "github.com/vlink-dev/vlink/filters/compress"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingListener counts the TCP connections a listener accepts.
type countingListener struct {
	net.Listener
	n     atomic.Int32
	mu    sync.Mutex
	conns []net.Conn
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *countingListener) last() net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[len(l.conns)-1]
}

// server is a VLink listener that echoes every connection it accepts.
type server struct {
	l       *vlink.Listener
	count   *countingListener
	targets chan string
	wg      sync.WaitGroup
}

func newServer(t *testing.T, lc vlink.ListenConfig) *server {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{count: &countingListener{Listener: inner}, targets: make(chan string, 100)}
	s.l, err = lc.NewListener(s.count)
	if err != nil {
		t.Fatal(err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.l.AcceptVLink()
			if err != nil {
				return
			}
			if h := c.Hello(); h != nil {
				s.targets <- h.Target
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { s.l.Close(); s.wg.Wait() })
	return s
}

func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != msg {
		t.Fatalf("echo: got %q, %v", b, err)
	}
}

// TestShared: sequential and concurrent dials share one session, so one
// TCP connection; each stream is its own connection at the listener.
func TestShared(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux+zstd")}
	defer d.Close()
	for range 20 {
		c, err := d.Dial("tcp", s.l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "hello")
		c.Close()
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.Dial("tcp", s.l.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			echo(t, c, "concurrent")
		}()
	}
	wg.Wait()
	if n := s.count.n.Load(); n != 1 {
		t.Errorf("40 dials opened %d TCP connections, want 1", n)
	}
}

// TestRedial: a session whose connection drops is replaced at the next
// dial; the streams it carried fail with ErrSessionClosed, not io.EOF.
func TestRedial(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux")}
	defer d.Close()
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "before")
	s.count.last().Close() // the session's TCP connection, at the listener
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("read on a stream of a dropped session: %v, want ErrSessionClosed", err)
	}
	// smux notices a dead connection on its next read or keepalive; a
	// dial right after may find the old session still open, fail to use
	// it, and dial a new one.
	c2, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	echo(t, c2, "after")
	if n := s.count.n.Load(); n != 2 {
		t.Errorf("%d TCP connections, want 2", n)
	}
}

// TestIdle: a session idle for longer than its idle parameter is closed.
func TestIdle(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux:idle=1s")}
	defer d.Close()
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "x")
	c.Close()
	time.Sleep(2500 * time.Millisecond) // idle checks run every idle/2
	c2, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	echo(t, c2, "y")
	if n := s.count.n.Load(); n != 2 {
		t.Errorf("after the idle time: %d TCP connections, want 2 (the idle session closed)", n)
	}
}

// TestTargets: streams of one session through a gateway name their own
// targets, each checked by the listener's policy.
func TestTargets(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{Policy: vlink.Policy{Targets: []selector.Rule{
		{Host: "192.0.2.1", Action: selector.Direct},
		{Host: "192.0.2.2", Action: selector.Direct},
	}}})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux"), Via: s.l.Addr().String()}
	defer d.Close()
	for _, target := range []string{"192.0.2.1:80", "192.0.2.2:443"} {
		c, err := d.Dial("tcp", target)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, target)
		c.Close()
		if got := <-s.targets; got != target {
			t.Errorf("listener saw target %q, want %q", got, target)
		}
	}
	// Streams send early data: the refusal comes with the first read.
	refused, err := d.Dial("tcp", "192.0.2.3:22")
	if err != nil {
		t.Fatal(err)
	}
	refused.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := refused.Read(make([]byte, 1)); !errors.Is(err, vlink.ErrNotAllowed) {
		t.Errorf("read on a stream to a target the policy refuses: %v, want ErrNotAllowed", err)
	}
	var re *vlink.RefusedError
	if _, err := refused.Read(make([]byte, 1)); !errors.As(err, &re) || re.Code != vlink.CodeTarget {
		t.Errorf("second read: %v, want the same refusal", err)
	}
	refused.Close()
	// The refusal ended one stream, not the session.
	c, err := d.Dial("tcp", "192.0.2.1:80")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "still")
	c.Close()
	// WaitAccept: the refusal fails the dial itself, as it fails
	// net.Dial, and the stream still shares the session.
	wd := &vlink.Dialer{Stack: vlink.MustParse("mux"), Via: s.l.Addr().String(), WaitAccept: true}
	defer wd.Close()
	if c, err := wd.Dial("tcp", "192.0.2.3:22"); !errors.Is(err, vlink.ErrNotAllowed) {
		if c != nil {
			c.Close()
		}
		t.Errorf("WaitAccept dial to a target the policy refuses: %v, want ErrNotAllowed", err)
	}
	for i := range 3 {
		c, err := wd.Dial("tcp", "192.0.2.1:80")
		if err != nil {
			t.Fatalf("WaitAccept dial %d: %v", i, err)
		}
		echo(t, c, "accepted first")
		c.Close()
	}
	if n := s.count.n.Load(); n != 2 {
		t.Errorf("%d TCP connections for two dialers, want 2", n)
	}
}

// TestLookup: a lookup through mux is a stream of the session, answered
// by the nested hello's listener, and leaves the session working.
func TestLookup(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{
		Policy: vlink.Policy{Targets: []selector.Rule{{Host: "*.test", Action: selector.Direct}}},
		Lookup: func(ctx context.Context, h *vlink.Hello) (vlink.Families, error) {
			if h.Target == "v6.test:0" {
				return vlink.FamilyIPv6, nil
			}
			return 0, &net.DNSError{Err: "no such host", Name: h.Target, IsNotFound: true}
		},
	})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux"), Via: s.l.Addr().String()}
	defer d.Close()
	ctx := context.Background()
	for range 2 {
		if f, err := d.LookupHost(ctx, "v6.test:0"); err != nil || f != vlink.FamilyIPv6 {
			t.Fatalf("LookupHost(v6.test) = %v, %v", f, err)
		}
		var dnsErr *net.DNSError
		if _, err := d.LookupHost(ctx, "nosuch.test:0"); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Fatalf("LookupHost(nosuch.test) = %v, want not found", err)
		}
	}
	c, err := d.Dial("tcp", "v6.test:80")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "after lookups")
	c.Close()
	if n := s.count.n.Load(); n != 1 {
		t.Errorf("%d TCP connections for 4 lookups and a dial, want 1", n)
	}
}

// TestListenerClose: closing the listener refuses new streams but leaves
// the accepted ones working.
func TestListenerClose(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux")}
	defer d.Close()
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "one")
	s.l.Close()
	echo(t, c, "two")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c2, err := d.DialContext(ctx, "tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err) // early data: the answer comes with the first read
	}
	defer c2.Close()
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c2.Read(make([]byte, 1)); !errors.Is(err, vlink.ErrNotVLink) {
		t.Fatalf("read on a stream opened after the listener closed: %v, want ErrNotVLink", err)
	}
}

// TestDialerClose: Dialer.Close ends the session and its streams.
func TestDialerClose(t *testing.T) {
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.MustParse("mux")}
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, "x")
	d.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("read after Dialer.Close: %v, want ErrSessionClosed", err)
	}
}

// TestLastBytes: a stream whose reader has half-closed its own side reads
// the peer's last bytes, then io.EOF, with the Read started before the
// peer writes. The window in which smux v1.5.58 loses a last frame is
// too narrow for this test to meet it (it passes without the second
// look of stream.readBelow); TestLastFrameRace replays it.
func TestLastBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{
		{"one byte", 1},
		{"one frame", 100},
		{"two chunks", chunkSize + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := sessionPair(t)
			want := make([]byte, tc.size)
			for i := range want {
				want[i] = byte(i)
			}
			for i := 0; i < 50; i++ {
				st, err := client.OpenStream()
				if err != nil {
					t.Fatal(err)
				}
				c := newStream(st)
				sst, err := server.AcceptStream()
				if err != nil {
					t.Fatal(err)
				}
				s := newStream(sst)
				if err := s.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				got := make(chan []byte, 1)
				go func() {
					b, err := io.ReadAll(s)
					if err != nil {
						t.Error(err)
					}
					got <- b
				}()
				if _, err := c.Write(want); err != nil {
					t.Fatal(err)
				}
				if err := c.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				if b := <-got; len(b) != len(want) {
					t.Fatalf("stream %d: read %d bytes, then io.EOF; the peer wrote %d", i, len(b), len(want))
				}
				c.Close()
				s.Close()
			}
		})
	}
}

// sessionPair returns the two ends of a smux session over loopback TCP,
// as the layer configures it, closed through t.Cleanup.
func sessionPair(t *testing.T) (client, server *smux.Session) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := l.Accept()
	if err != nil {
		c1.Close()
		t.Fatal(err)
	}
	cfg := Config{}.withDefaults().smux()
	if client, err = smux.Client(newSessionConn(c1), cfg); err == nil {
		server, err = smux.Server(newSessionConn(c2), cfg)
	}
	if err != nil {
		c1.Close()
		c2.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestEnds: a stream ends cleanly for its peer only when it was closed
// (Close, CloseWrite, or both), with every byte written; an abort, a
// Close that cuts a Write short, or the end of the session reaches the
// peer's Read and WriteTo as an error, never as io.EOF after a short
// stream.
func TestEnds(t *testing.T) {
	data := testnet.RandomBytes(3*DefaultWindow, 5) // more than the window: chunks wait at the end
	type streams struct {
		client, server *smux.Session
		c, s           *stream
	}
	for _, tc := range []struct {
		name   string
		end    func(p streams)
		during bool  // end while the Write still runs (nobody reads)
		want   error // nil for all of data, then io.EOF
	}{
		{"Close", func(p streams) { p.c.Close() }, false, nil},
		{"CloseWrite", func(p streams) { p.c.CloseWrite() }, false, nil},
		{"CloseWrite then Close", func(p streams) { p.c.CloseWrite(); p.c.Close() }, false, nil},
		{"Abort", func(p streams) { p.c.Abort() }, false, ErrAborted},
		{"netconn.Abort", func(p streams) { netconn.Abort(p.c) }, false, ErrAborted},
		{"Close during a Write", func(p streams) { p.c.Close() }, true, ErrAborted},
		{"the session closed", func(p streams) { p.client.Close() }, false, ErrSessionClosed},
	} {
		for _, how := range []string{"Read", "WriteTo"} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				client, server := sessionPair(t)
				st, err := client.OpenStream()
				if err != nil {
					t.Fatal(err)
				}
				c := newStream(st)
				defer c.Close()
				sst, err := server.AcceptStream()
				if err != nil {
					t.Fatal(err)
				}
				s := newStream(sst)
				defer s.Close()

				ended := make(chan struct{})
				type result struct {
					got []byte
					err error
				}
				read := make(chan result, 1)
				go func() {
					if tc.during {
						<-ended
					}
					s.SetReadDeadline(time.Now().Add(10 * time.Second))
					var got bytes.Buffer
					var err error
					if how == "Read" {
						_, err = io.CopyBuffer(&got, struct{ io.Reader }{s}, make([]byte, 1000))
					} else {
						_, err = s.WriteTo(&got)
					}
					read <- result{got.Bytes(), err}
				}()
				wrote := make(chan error, 1)
				go func() { _, err := c.Write(data); wrote <- err }()
				if tc.during {
					time.Sleep(50 * time.Millisecond) // the Write blocks: nobody reads
				} else if err := <-wrote; err != nil {
					t.Fatal(err)
				}
				tc.end(streams{client, server, c, s})
				close(ended)
				r := <-read
				switch {
				case tc.want == nil && (r.err != nil || !bytes.Equal(r.got, data)):
					t.Fatalf("peer read %d of %d bytes, then %v; want them all, then io.EOF", len(r.got), len(data), r.err)
				case tc.want != nil && !errors.Is(r.err, tc.want):
					t.Fatalf("peer read %d of %d bytes, then %v; want %v", len(r.got), len(data), r.err, tc.want)
				case !bytes.Equal(r.got, data[:len(r.got)]):
					t.Fatalf("peer read %d bytes that differ from what was sent", len(r.got))
				}
				if tc.want == ErrAborted && !errors.Is(r.err, io.ErrUnexpectedEOF) {
					t.Errorf("%v does not match io.ErrUnexpectedEOF", r.err)
				}
				if tc.during {
					if err := <-wrote; !errors.Is(err, net.ErrClosed) {
						t.Errorf("the Write Close cut short: %v, want net.ErrClosed", err)
					}
				}
			})
		}
	}
}

// TestAbortThroughDialer: netconn.Abort on what a vlink.Dialer returned
// for a mux stack (a stream whose nested hello travelled as early data,
// maybe under a filter) reaches the stream: the listener's side reads an
// error after the bytes sent, never a clean end; Close still ends it
// cleanly.
func TestAbortThroughDialer(t *testing.T) {
	for _, stack := range []string{"mux", "zstd+mux", "mux+zstd"} {
		for _, abort := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/abort=%v", stack, abort), func(t *testing.T) {
				var lc vlink.ListenConfig
				l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				type result struct {
					n   int64
					err error
				}
				got := make(chan result, 1)
				go func() {
					c, err := l.Accept()
					if err != nil {
						got <- result{0, err}
						return
					}
					defer c.Close()
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					n, err := io.Copy(io.Discard, c)
					got <- result{n, err}
				}()
				d := &vlink.Dialer{Stack: vlink.MustParse(stack)}
				defer d.Close()
				c, err := d.Dial("tcp", l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Write(make([]byte, 100<<10)); err != nil {
					t.Fatal(err)
				}
				if abort {
					netconn.Abort(c)
				} else {
					c.Close()
				}
				r := <-got
				switch {
				case abort && r.err == nil:
					t.Fatalf("the listener read %d bytes, then a clean end; want an error", r.n)
				case abort && errors.Is(r.err, os.ErrDeadlineExceeded):
					t.Fatalf("the listener read %d bytes, then nothing: the abort never came", r.n)
				case !abort && (r.err != nil || r.n != 100<<10):
					t.Fatalf("the listener read %d bytes, then %v; want 102400, then the end", r.n, r.err)
				}
			})
		}
	}
}

// TestWireVersion: a stack names mux's wire version 1 or none; another is
// a bad parameter on the dialer's side, before anything is sent, whether
// the stack is parsed or built by hand (a listener refuses it too, with
// vlink.CodeVersion: vlink's TestWireVersionRefused).
func TestWireVersion(t *testing.T) {
	if _, err := vlink.Parse("mux:version=1"); err != nil {
		t.Errorf("mux:version=1: %v", err)
	}
	if _, err := vlink.Parse("mux:version=2"); !errors.Is(err, vlink.ErrBadParam) {
		t.Errorf("mux:version=2 parsed: %v, want ErrBadParam", err)
	}
	s := newServer(t, vlink.ListenConfig{})
	d := &vlink.Dialer{Stack: vlink.Stack{Layers: []vlink.Layer{{Name: "mux", Params: map[string]string{"version": "2"}}, {Name: "tcp"}}}}
	defer d.Close()
	c, err := d.Dial("tcp", s.l.Addr().String())
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, vlink.ErrBadParam) {
		t.Fatalf("dialing with mux version 2: %v, want ErrBadParam", err)
	}
	if n := s.count.n.Load(); n != 0 {
		t.Errorf("the listener accepted %d connections, want none", n)
	}
}

// streamPair opens a stream on a new session: the dialer's end and the
// listener's.
func streamPair(t *testing.T) (client, server *smux.Session, c, s *stream) {
	t.Helper()
	client, server = sessionPair(t)
	st, err := client.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	c = newStream(st)
	t.Cleanup(func() { c.Close() })
	sst, err := server.AcceptStream()
	if err != nil {
		t.Fatal(err)
	}
	s = newStream(sst)
	t.Cleanup(func() { s.Close() })
	return client, server, c, s
}

// readEnd reads c to its end, through Read or WriteTo.
func readEnd(c *stream, how string) ([]byte, error) {
	var got bytes.Buffer
	err := readEndTo(&got, c, how)
	return got.Bytes(), err
}

func readEndTo(w io.Writer, c *stream, how string) error {
	var err error
	if how == "Read" {
		_, err = io.CopyBuffer(w, struct{ io.Reader }{c}, make([]byte, 1000))
	} else {
		_, err = c.WriteTo(w)
	}
	return err
}

// notifyBuffer is a buffer that closes full once it holds n bytes. It
// has no ReadFrom, so that io.Copy writes to it.
type notifyBuffer struct {
	buf  bytes.Buffer
	n    int
	full chan struct{}
}

func (b *notifyBuffer) Write(p []byte) (int, error) {
	n, err := b.buf.Write(p)
	if b.buf.Len() >= b.n && b.full != nil {
		close(b.full)
		b.full = nil
	}
	return n, err
}

// checkSession fails the test unless a new stream of the session carries
// bytes both ways.
func checkSession(t *testing.T, client, server *smux.Session) {
	t.Helper()
	st, err := client.OpenStream()
	if err != nil {
		t.Fatalf("opening a stream after: %v", err)
	}
	c := newStream(st)
	defer c.Close()
	sst, err := server.AcceptStream()
	if err != nil {
		t.Fatalf("accepting a stream after: %v", err)
	}
	s := newStream(sst)
	defer s.Close()
	for _, p := range [][2]*stream{{c, s}, {s, c}} {
		p[0].SetDeadline(time.Now().Add(10 * time.Second))
		p[1].SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := p[0].Write([]byte("still")); err != nil {
			t.Fatalf("a stream opened after: %v", err)
		}
		b := make([]byte, 5)
		if _, err := io.ReadFull(p[1], b); err != nil || string(b) != "still" {
			t.Fatalf("a stream opened after: read %q, %v", b, err)
		}
	}
}

// TestPeerGone: once a stream's peer has closed it for good (Close or
// Abort, after CloseWrite or without it), this side's writes fail within
// moments, as a TCP write does once the peer's reset answers it: with
// EPIPE after the peer's end of stream, with ECONNRESET after an abort
// without it, never waiting for the peer's window forever (issue 38: the
// target behind `vlink serve` kept writing into a stream whose client was
// gone). Both ends of the session take both parts: the half-closing end
// is the dialer's in a download, the listener's in an upload. The session
// and its other streams carry on.
func TestPeerGone(t *testing.T) {
	for _, tc := range []struct {
		name       string
		closeWrite bool
		end        func(*stream) error
		want       error // what the peer's writes fail with
		readErr    error // what the peer's reader ends with; nil for io.EOF
	}{
		{"CloseWrite, Abort", true, (*stream).Abort, syscall.EPIPE, nil},
		{"CloseWrite, netconn.Abort", true, func(s *stream) error { return netconn.Abort(s) }, syscall.EPIPE, nil},
		{"CloseWrite, Close", true, (*stream).Close, syscall.EPIPE, nil},
		{"Close", false, (*stream).Close, syscall.EPIPE, nil},
		{"Abort", false, (*stream).Abort, syscall.ECONNRESET, ErrAborted},
	} {
		for _, side := range []string{"dialer", "listener"} {
			for _, how := range []string{"Read", "WriteTo"} {
				t.Run(tc.name+"/"+side+" ends/"+how, func(t *testing.T) {
					client, server, c, s := streamPair(t)
					a, b := c, s // a ends the stream; b writes on
					if side == "listener" {
						a, b = s, c
					}
					type result struct {
						got []byte
						err error
					}
					read := make(chan result, 1)
					got := &notifyBuffer{n: len("request"), full: make(chan struct{})}
					gotRequest := got.full
					go func() {
						b.SetReadDeadline(time.Now().Add(10 * time.Second))
						err := readEndTo(got, b, how)
						read <- result{got.buf.Bytes(), err}
					}()
					type failed struct {
						err error
						at  time.Time
					}
					wrote := make(chan failed, 1)
					go func() {
						buf := make([]byte, 32<<10)
						for {
							if _, err := b.Write(buf); err != nil {
								wrote <- failed{err, time.Now()}
								return
							}
						}
					}()
					if _, err := a.Write([]byte("request")); err != nil {
						t.Fatal(err)
					}
					if tc.closeWrite {
						if err := a.CloseWrite(); err != nil {
							t.Fatal(err)
						}
					}
					a.SetReadDeadline(time.Now().Add(10 * time.Second))
					if _, err := io.ReadFull(a, make([]byte, 256<<10)); err != nil {
						t.Fatal(err)
					}
					// The request, and its end record, go in the background:
					// the stream ends after them.
					select {
					case <-gotRequest:
					case <-time.After(10 * time.Second):
						t.Fatal("the peer has not read the request after 10s")
					}
					var r result
					if tc.closeWrite {
						r = <-read // its end record
					}
					ended := time.Now()
					if err := tc.end(a); err != nil {
						t.Fatal(err)
					}
					var w failed
					select {
					case w = <-wrote:
					case <-time.After(2 * time.Second):
						t.Fatal("the peer's Write still runs 2s after the stream ended")
					}
					switch {
					case !errors.Is(w.err, tc.want) || !errors.Is(w.err, ErrAborted):
						t.Errorf("the peer's Write: %v; want ErrAborted and %v", w.err, tc.want)
					case !netconn.ResetByPeer(w.err):
						t.Errorf("the peer's Write: %v, which netconn.ResetByPeer does not take for a reset", w.err)
					}
					t.Logf("the peer's Write failed %v after the end: %v", w.at.Sub(ended).Round(time.Millisecond), w.err)
					if _, err := b.Write([]byte("more")); !errors.Is(err, tc.want) {
						t.Errorf("a later Write: %v, want %v", err, tc.want)
					}
					if !tc.closeWrite {
						r = <-read
					}
					if string(r.got) != "request" || (tc.readErr == nil && r.err != nil) || (tc.readErr != nil && !errors.Is(r.err, tc.readErr)) {
						t.Errorf("the peer read %q, then %v; want %q, then %v", r.got, r.err, "request", tc.readErr)
					}
					if err := b.Close(); err != nil {
						t.Errorf("the peer's Close: %v", err)
					}
					checkSession(t, client, server)
				})
			}
		}
	}
}

// TestHalfCloseExchange: a request, its end, then the answer, read to its
// end before the asker closes, ends cleanly on both sides, whichever end
// asks and however the other ends: no error, no byte lost, though the
// answer is larger than the window. So it does with an asker from before
// the close mark (frame.go), which sent smux's FIN with its end record.
func TestHalfCloseExchange(t *testing.T) {
	request := testnet.RandomBytes(100<<10, 7)
	answer := testnet.RandomBytes(3*DefaultWindow, 8)
	for _, asker := range []string{"", "old "} {
		for _, side := range []string{"dialer", "listener"} {
			for _, how := range []string{"Read", "WriteTo"} {
				for _, closeWrite := range []bool{false, true} {
					name := fmt.Sprintf("%s%s asks/%s/answer then CloseWrite=%v", asker, side, how, closeWrite)
					t.Run(name, func(t *testing.T) { halfCloseExchange(t, request, answer, asker != "", side, how, closeWrite) })
				}
			}
		}
	}
}

func halfCloseExchange(t *testing.T, request, answer []byte, old bool, side, how string, closeWrite bool) {
	_, _, c, s := streamPair(t)
	a, b := c, s
	if side == "listener" {
		a, b = s, c
	}
	a.SetDeadline(time.Now().Add(10 * time.Second))
	b.SetDeadline(time.Now().Add(10 * time.Second))
	bDone := make(chan error, 1)
	aClosed := make(chan struct{})
	go func() {
		got, err := readEnd(b, how)
		if err != nil || !bytes.Equal(got, request) {
			bDone <- fmt.Errorf("the answering side read %d of %d bytes, then %v", len(got), len(request), err)
			return
		}
		if _, err := b.Write(answer); err != nil {
			bDone <- fmt.Errorf("the answer: %w", err)
			return
		}
		if closeWrite {
			if err := b.CloseWrite(); err != nil {
				bDone <- fmt.Errorf("CloseWrite after the answer: %w", err)
				return
			}
			<-aClosed
			time.Sleep(50 * time.Millisecond) // the asker's close arrives
		}
		bDone <- b.Close()
	}()
	if old {
		// The records, the end record and smux's FIN, at once.
		for b := request; len(b) > 0; b = b[min(len(b), chunkData):] {
			if _, err := a.st.Write(record(b[:min(len(b), chunkData)])); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.st.Write([]byte(endRecord)); err != nil {
			t.Fatal(err)
		}
		if err := a.st.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	} else {
		if _, err := a.Write(request); err != nil {
			t.Fatal(err)
		}
		if err := a.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readEnd(a, how)
	if err != nil || !bytes.Equal(got, answer) {
		t.Fatalf("the asker read %d of %d bytes, then %v", len(got), len(answer), err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("the asker's Close: %v", err)
	}
	close(aClosed)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
}

// countingConn serves r's bytes to Read and counts the reads.
type countingConn struct {
	net.Conn // nil: only Read is called
	r        io.Reader
	reads    int
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// TestSessionConnReadsFramesTogether: frames that arrived together are
// read from the connection below in one read, though smux reads each
// header and each body apart; the connection's end is still an error.
func TestSessionConnReadsFramesTogether(t *testing.T) {
	const frames = 5
	var wire []byte
	for i := range frames {
		hdr := [8]byte{2, 2, 3, 0, byte(i + 1)} // version, cmdPSH, length 3, stream id
		wire = append(append(wire, hdr[:]...), 'a', 'b', byte('0'+i))
	}
	below := &countingConn{r: bytes.NewReader(wire)}
	c := newSessionConn(below)
	for i := range frames {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, binary.LittleEndian.Uint16(hdr[2:]))
		if _, err := io.ReadFull(c, body); err != nil {
			t.Fatal(err)
		}
		if want := []byte{'a', 'b', byte('0' + i)}; !bytes.Equal(body, want) {
			t.Fatalf("frame %d: body %q, want %q", i, body, want)
		}
	}
	if below.reads != 1 {
		t.Errorf("%d frames took %d reads of the connection below, want 1", frames, below.reads)
	}
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read at the connection's end: %v, want io.ErrUnexpectedEOF", err)
	}
}

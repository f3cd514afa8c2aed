package quic

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) {
	code := m.Run()
	CloseAll()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

func newFactory(t testing.TB, o Options) *Factory {
	t.Helper()
	f, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func listen(t testing.TB, f *Factory) *listener {
	t.Helper()
	l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*listener)
}

// pair returns a stream's two ends, the dialer's first, over l.
func pair(t testing.TB, f *Factory, l net.Listener) (net.Conn, net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		acc <- res{c, err}
	}()
	d, err := f.DialContext(context.Background(), "tcp", l.Addr().String(), nil)
	if err != nil {
		return nil, nil, err
	}
	r := <-acc
	if r.err != nil {
		d.Close()
		return nil, nil, r.err
	}
	return d, r.c, nil
}

func mustPair(t testing.TB, f *Factory, l net.Listener) (net.Conn, net.Conn) {
	t.Helper()
	a, b, err := pair(t, f, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestConformance(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		a, b, err := pair(t, f, l)
		if err != nil {
			return nil, nil, nil, err
		}
		return a, b, func() { a.Close(); b.Close() }, nil
	})
}

// TestTransfer sends random bytes both ways at once, each way closed
// with CloseWrite, and checks each side got exactly what the other sent.
func TestTransfer(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	for _, size := range []int{0, 1, 1200, 64<<10 + 7, 3 << 20} {
		a, b := mustPair(t, f, l)
		var wg sync.WaitGroup
		send := func(c net.Conn, seed uint64, sum *[32]byte, werr *error) {
			defer wg.Done()
			data := make([]byte, size)
			r := rand.New(rand.NewPCG(seed, uint64(size)))
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			*sum = sha256.Sum256(data)
			if _, *werr = c.Write(data); *werr == nil {
				*werr = c.(interface{ CloseWrite() error }).CloseWrite()
			}
		}
		recv := func(c net.Conn, sum *[32]byte, rerr *error) {
			defer wg.Done()
			h := sha256.New()
			_, *rerr = io.Copy(h, c)
			copy(sum[:], h.Sum(nil))
		}
		var sentA, sentB, gotA, gotB [32]byte
		var e [4]error
		wg.Add(4)
		go send(a, 1, &sentA, &e[0])
		go send(b, 2, &sentB, &e[1])
		go recv(b, &gotB, &e[2])
		go recv(a, &gotA, &e[3])
		wg.Wait()
		for i, err := range e {
			if err != nil {
				t.Fatalf("%d bytes: step %d: %v", size, i, err)
			}
		}
		if gotB != sentA || gotA != sentB {
			t.Fatalf("%d bytes: checksums differ", size)
		}
	}
}

// TestAbort: the peer of an aborted stream reads its bytes, then ErrReset
// (also ECONNRESET), never a clean end.
func TestAbort(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	for _, side := range []string{"dialer", "listener"} {
		t.Run(side, func(t *testing.T) {
			a, b := mustPair(t, f, l)
			if side == "listener" {
				a, b = b, a
			}
			if _, err := a.Write([]byte("part")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "part" {
				t.Fatalf("read %q, %v", buf, err)
			}
			if err := a.(interface{ Abort() error }).Abort(); err != nil {
				t.Fatal(err)
			}
			_, err := b.Read(buf)
			if !errors.Is(err, ErrReset) || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read after the peer's abort: %v, want ErrReset", err)
			}
			if _, err := a.Read(buf); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("read after own abort: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestCloseWhileWriting: a Close that cuts a blocked Write short resets
// the stream, so the peer cannot take the cut stream for a whole one.
func TestCloseWhileWriting(t *testing.T) {
	f := newFactory(t, Options{Window: 64 << 10})
	l := listen(t, f)
	a, b := mustPair(t, f, l)
	werr := make(chan error, 1)
	go func() {
		_, err := a.Write(make([]byte, 8<<20)) // far beyond the window: blocks
		werr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	a.Close()
	if err := <-werr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked write after Close: %v, want net.ErrClosed", err)
	}
	_, err := io.Copy(io.Discard, b)
	if !errors.Is(err, ErrReset) {
		t.Fatalf("the peer read to %v, want ErrReset", err)
	}
}

// TestOnePath: many streams to one listener share one QUIC connection,
// which closes after its linger once they are closed. It watches its own
// path, not the package's count: an earlier test's path may close while
// this one runs.
func TestOnePath(t *testing.T) {
	f := newFactory(t, Options{Linger: 200 * time.Millisecond})
	l := listen(t, f)
	before := livePaths()
	var conns []net.Conn
	for range 20 {
		a, b := mustPair(t, f, l)
		conns = append(conns, a, b)
	}
	var mine []*path
	for p := range livePaths() {
		if !before[p] {
			mine = append(mine, p)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("20 streams made %d QUIC connections, want 1", len(mine))
	}
	l.mu.Lock()
	n := len(l.paths)
	l.mu.Unlock()
	if n != 1 {
		t.Fatalf("the listener holds %d paths, want 1", n)
	}
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for livePaths()[mine[0]] {
		if time.Now().After(deadline) {
			t.Fatal("the path did not close after its linger")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// livePaths returns the dialers' paths not yet closed.
func livePaths() map[*path]bool {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	return maps.Clone(pool.live)
}

// TestListenerCloseKeepsStreams: closing a listener stops new streams but
// leaves those it handed out working, as a TCP listener does.
func TestListenerCloseKeepsStreams(t *testing.T) {
	f := newFactory(t, Options{})
	lis, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := pair(t, f, lis)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	lis.Close()
	if _, err := lis.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
	if _, err := a.Write([]byte("still")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "still" {
		t.Fatalf("read %q, %v", buf, err)
	}
	b.Close()
	a.Close()
}

func TestPin(t *testing.T) {
	lf := newFactory(t, Options{})
	l := listen(t, lf)
	pin, err := ParsePin(l.Pin())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("right", func(t *testing.T) {
		f := newFactory(t, Options{Pin: &pin, Linger: time.Millisecond})
		a, b := mustPair(t, f, l)
		checkEcho(t, a, b)
	})
	t.Run("wrong", func(t *testing.T) {
		other := pin
		other[0] ^= 1
		f := newFactory(t, Options{Pin: &other})
		_, err := f.DialContext(context.Background(), "tcp", l.Addr().String(), nil)
		if !errors.Is(err, ErrPin) {
			t.Fatalf("dial with a wrong pin: %v, want ErrPin", err)
		}
	})
}

func checkEcho(t *testing.T, a, b net.Conn) {
	t.Helper()
	if _, err := a.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// TestChannelBinding: both ends of a stream see the same binding, and
// different QUIC connections see different ones.
func TestChannelBinding(t *testing.T) {
	l := listen(t, newFactory(t, Options{}))
	a, b := mustPair(t, newFactory(t, Options{}), l)
	c, d := mustPair(t, newFactory(t, Options{Window: 1 << 20}), l) // other options: another path
	ba, bb := a.(layer.ChannelBinder).ChannelBinding(), b.(layer.ChannelBinder).ChannelBinding()
	if len(ba) != 32 || !bytes.Equal(ba, bb) {
		t.Fatalf("the ends' bindings differ: %x, %x", ba, bb)
	}
	if bc := c.(layer.ChannelBinder).ChannelBinding(); bytes.Equal(ba, bc) || !bytes.Equal(bc, d.(layer.ChannelBinder).ChannelBinding()) {
		t.Fatalf("two QUIC connections share a binding, or one's ends differ")
	}
}

// TestBadOpen: a stream that opens with anything but the stream byte is
// refused, and the listener goes on.
func TestBadOpen(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	p, _, err := f.path(context.Background(), "tcp", l.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.qc.OpenStreamSync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("GET / HTTP/1.0\r\n"))
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a bad stream was not refused: %v", err)
	}
	s.CancelWrite(0)
	p.release()
	a, b := mustPair(t, f, l)
	checkEcho(t, a, b)
}

// TestRestartedListener: a path whose listener died without a word (its
// process restarted on the same port) is found out by the next dial,
// which goes on a new path in a few round trips, not at its deadline.
func TestRestartedListener(t *testing.T) {
	f := newFactory(t, Options{})
	old, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := old.Addr().String()
	a, b := mustPair(t, f, old)
	checkEcho(t, a, b)
	a.Close()
	b.Close()
	// Gone without a CONNECTION_CLOSE, as a killed process is.
	ol := old.(*listener)
	ol.cancel()
	ol.closeSocket()
	ol.ql.Close()

	lis, err := f.Listen(context.Background(), "tcp", addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	acc := acc2(lis)
	c, err := f.DialContext(ctx, "tcp", addr, nil)
	if err != nil {
		t.Fatalf("dial after the listener restarted: %v", err)
	}
	defer c.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the dial took %v to leave the dead path", took)
	}
	d := <-acc
	defer d.Close()
	checkEcho(t, c, d)
}

// TestPathsPerSource: one address gets MaxPathsPerSource QUIC
// connections to a listener; the next is closed at once, with an error
// its dialer sees, and the listener goes on serving the others.
func TestPathsPerSource(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 257 QUIC connections")
	}
	l := listen(t, newFactory(t, Options{}))
	defer CloseAll()
	var first [2]net.Conn
	for i := range MaxPathsPerSource {
		// Options differ, so each dial makes a path of its own.
		f := newFactory(t, Options{Linger: time.Minute + time.Duration(i)})
		a, b := mustPair(t, f, l)
		if i == 0 {
			first = [2]net.Conn{a, b}
		}
	}
	f := newFactory(t, Options{Linger: 2 * time.Minute})
	_, err := f.DialContext(context.Background(), "tcp", l.Addr().String(), nil)
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || ae.ErrorCode != codeBusy {
		t.Fatalf("dial %d from one address: %v, want the listener's refusal", MaxPathsPerSource+1, err)
	}
	checkEcho(t, first[0], first[1])
}

// TestCertFile: a listener given a certificate file makes it (mode 600)
// and keeps its pin across listens; a file others can read is refused.
func TestCertFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quic.pem")
	f := newFactory(t, Options{CertFile: path})
	pins := make([]string, 2)
	for i := range pins {
		l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		pins[i] = l.(*listener).Pin()
		l.Close()
	}
	if pins[0] != pins[1] {
		t.Fatalf("the pin changed across listens: %s, %s", pins[0], pins[1])
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the certificate file: %v, %v", fi.Mode(), err)
	}
	os.Chmod(path, 0o644)
	if _, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key file: %v, want a refusal", err)
	}
}

// TestHappyEyeballs: a name whose first address does not answer (a
// QUIC handshake there goes unanswered, or cannot be sent) is dialed on
// its next address 300 ms later, not after the handshake's timeout.
func TestHappyEyeballs(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	_, port, _ := net.SplitHostPort(l.Addr().String())
	lookupNetIP = func(context.Context, string, string) ([]netip.Addr, error) {
		// 192.0.2.1 is TEST-NET-1: nothing answers there.
		return []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	defer func() { lookupNetIP = net.DefaultResolver.LookupNetIP }()
	acc := acc2(l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := f.DialContext(ctx, "tcp", net.JoinHostPort("two.example", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the dial took %v", took)
	}
	d := <-acc
	defer d.Close()
	checkEcho(t, c, d)
}

// TestSilentStreamsBound: streams that never send their first byte hold
// at most MaxOpening of the listener's slots; the next stream is refused
// at once (codeBusyStream), not left waiting for the open timeout, and a
// stream holding a slot is served once it opens.
func TestSilentStreamsBound(t *testing.T) {
	l := listen(t, newFactory(t, Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	qc, err := quic.DialAddr(ctx, l.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpnV1}},
		&quic.Config{MaxIdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	// Streams reach the listener in order, and a byte on the last one
	// opens all below it there: all but the last are silent.
	streams := make([]*quic.Stream, MaxOpening+2)
	for i := range streams {
		if streams[i], err = qc.OpenStream(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if _, err := streams[len(streams)-1].Write([]byte{streamOpen}); err != nil {
		t.Fatal(err)
	}
	// Well before openTimeout, which would end a silent stream anyway.
	for _, i := range []int{MaxOpening, MaxOpening + 1} {
		streams[i].SetReadDeadline(time.Now().Add(openTimeout / 2))
		_, err := streams[i].Read(make([]byte, 1))
		var se *quic.StreamError
		if !errors.As(err, &se) || se.ErrorCode != codeBusyStream || !se.Remote {
			t.Errorf("stream %d, past %d silent ones: %v, want the listener's refusal (code %#x)", i+1, MaxOpening, err, codeBusyStream)
		}
	}
	// The first and the last silent streams held slots all along: they
	// open, and are served.
	for _, i := range []int{0, MaxOpening - 1} {
		if _, err := streams[i].Write([]byte{streamOpen, 'p', 'i', 'n', 'g'}); err != nil {
			t.Fatalf("stream %d of %d, within the bound: %v", i+1, MaxOpening, err)
		}
	}
	acc := make(chan net.Conn, 2)
	go func() {
		for range 2 {
			c, _ := l.Accept()
			acc <- c
		}
	}()
	for range 2 {
		select {
		case c := <-acc:
			if c == nil {
				t.Fatal("the listener closed")
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 4)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("a stream that held a slot: read %q, %v", buf, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a stream that held a slot was not served once it opened")
		}
	}
}

// CloseAll closes the connections listeners accepted too: at a program's
// exit its peers learn at once that the path ended, not at their idle
// timeout.
func TestCloseAllListenerPaths(t *testing.T) {
	l := listen(t, newFactory(t, Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	qc, err := quic.DialAddr(ctx, l.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpnV1}},
		&quic.Config{MaxIdleTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	s, err := qc.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte{streamOpen}); err != nil {
		t.Fatal(err)
	}
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	CloseAll()
	select {
	case <-qc.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's connection is still up 5 s after CloseAll")
	}
}

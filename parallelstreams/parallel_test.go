package parallelstreams

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// session returns the *Session under a connection a Dialer or Listener
// returned for a stack whose top layer is parallel.
func session(t testing.TB, c net.Conn) *Session {
	t.Helper()
	if vc, ok := c.(*vlink.Conn); ok {
		c = vc.UnwrapConn()
	}
	s, ok := c.(*Session)
	if !ok {
		t.Fatalf("connection is a %T, not a *Session", c)
	}
	return s
}

// TestTransfers sends seeded streams both ways at once, each side
// half-closing after it, and checks every byte by SHA-256.
func TestTransfers(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	stacks := []string{"parallel:streams=1", "parallel:streams=3", "parallel:streams=8,window=256K", "parallel:streams=8,auto"}
	sizes := []int64{0, 1, 100_003, 5 << 20, 48 << 20}
	if testing.Short() {
		sizes = sizes[:4]
	}
	for _, stack := range stacks {
		for _, size := range sizes {
			t.Run(stack+"/"+itoa(size), func(t *testing.T) {
				c, s := dialPair(t, l, stack)
				var wg sync.WaitGroup
				var sent [2][32]byte
				var errs [2]error
				for i, w := range []net.Conn{c, s} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sent[i], errs[i] = sendSum(w, uint64(i+1), size)
						if errs[i] == nil {
							errs[i] = netconn.CloseWrite(w)
						}
					}()
				}
				for i, r := range []net.Conn{s, c} {
					n, ok, err := prefixCheck(r, uint64(i+1))
					if err != nil || n != size || !ok {
						t.Errorf("side %d received %d bytes (want %d), in order: %v, err %v", i, n, size, ok, err)
					}
				}
				wg.Wait()
				if errs[0] != nil || errs[1] != nil {
					t.Fatalf("send errors: %v", errs)
				}
			})
		}
	}
}

func itoa(n int64) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestSubstreamCut closes one substream's TCP connection in the middle of
// a transfer, as a killed process or a reset from a firewall would: both
// ends fail with an error naming a substream, within bounded time, and
// everything delivered before is the exact prefix of what was sent.
func TestSubstreamCut(t *testing.T) {
	id := uniqueID()
	l := listen(t, vlink.ListenConfig{})
	c, s := dialPair(t, l, "parallel:streams=4+rec:id="+id)
	subs := recordedConns(id)
	if len(subs) != 4 {
		t.Fatalf("recorded %d substreams, want 4", len(subs))
	}
	writeErr := make(chan error, 1)
	go func() {
		_, err := sendSum(c, 7, 1<<40) // far more than will get through
		writeErr <- err
	}()
	r := &cutter{r: s, after: 8 << 20, cut: func() { subs[2].Close() }}
	start := time.Now()
	n, ok, err := prefixCheck(r, 7)
	if !ok {
		t.Fatalf("the %d bytes received before the failure are not the stream's prefix", n)
	}
	var se *SubstreamError
	if err == nil || !errors.As(err, &se) {
		t.Fatalf("read after a cut substream: n=%d err=%v, want a *SubstreamError", n, err)
	}
	if n >= 1<<40 {
		t.Fatal("no failure")
	}
	t.Logf("reader: %d bytes in order, then: %v", n, err)
	select {
	case err := <-writeErr:
		if !errors.As(err, &se) {
			t.Errorf("write after a cut substream: %v, want a *SubstreamError", err)
		}
		t.Logf("writer: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("writer still blocked 10s after the cut")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("failure took %v", d)
	}
}

// TestAbort: a session ended by netconn.Abort (what a relay does when the
// other side failed) fails its peer's Read; one ended by Close gives the
// peer everything written, then io.EOF.
func TestAbort(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	for _, tc := range []struct {
		name  string
		end   func(net.Conn) error
		clean bool
	}{
		{"Close", func(c net.Conn) error { return c.Close() }, true},
		{"netconn.Abort", netconn.Abort, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := dialPair(t, l, "parallel:streams=3")
			data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
			if _, err := c.Write(data); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(s, make([]byte, 1<<10)); err != nil {
				t.Fatal(err)
			}
			if err := tc.end(c); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(s)
			n := len(got) + 1<<10
			switch {
			case tc.clean && (err != nil || n != len(data)):
				t.Fatalf("peer read %d of %d bytes, then %v; want them all, then io.EOF", n, len(data), err)
			case !tc.clean && (err == nil || errors.Is(err, os.ErrDeadlineExceeded)):
				t.Fatalf("peer read %d of %d bytes, then %v; want an error", n, len(data), err)
			}
		})
	}
}

// cutter reads from r and calls cut once after `after` bytes.
type cutter struct {
	r     io.Reader
	after int64
	n     int64
	cut   func()
}

func (c *cutter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.cut != nil && c.n >= c.after {
		c.cut()
		c.cut = nil
	}
	return n, err
}

// TestSilentStall blackholes one substream (its path stops carrying
// anything, as a firewall that drops packets does): the writer's
// stall-timeout ends the connection with a clear error instead of
// hanging.
func TestSilentStall(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	bh := newBlackhole(t, l.Addr().String())
	d := &vlink.Dialer{Stack: vlink.MustParse("parallel:streams=3,stall-timeout=1s"), Timeout: 10 * time.Second}
	defer d.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		s, err := l.Accept()
		if err == nil {
			accepted <- s
		}
	}()
	c, err := d.Dial("tcp", bh.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	go io.Copy(io.Discard, s)
	bh.stall(1) // the second substream stops carrying bytes
	start := time.Now()
	_, err = sendSum(c, 3, 1<<40)
	var se *SubstreamError
	if !errors.As(err, &se) || se.Op != "write" {
		t.Fatalf("write over a stalled substream: %v, want a write *SubstreamError", err)
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// blackhole is a TCP proxy whose connections can each be made to stop
// forwarding, without closing: a path that silently drops everything.
type blackhole struct {
	addr  string
	mu    sync.Mutex
	conns []*bhConn
}

type bhConn struct {
	stalled chan struct{}
	once    sync.Once
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var open []net.Conn
	var openMu sync.Mutex
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		ln.Close()
		openMu.Lock()
		for _, c := range open {
			c.Close()
		}
		openMu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			openMu.Lock()
			open = append(open, in, out)
			openMu.Unlock()
			bc := &bhConn{stalled: make(chan struct{})}
			b.mu.Lock()
			b.conns = append(b.conns, bc)
			b.mu.Unlock()
			for _, dir := range [][2]net.Conn{{in, out}, {out, in}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					buf := make([]byte, 32<<10)
					for {
						n, err := dir[0].Read(buf)
						select {
						case <-bc.stalled:
							<-done // hold on: never forward, never close
							return
						default:
						}
						if n > 0 {
							dir[1].Write(buf[:n])
						}
						if err != nil {
							netconn.CloseWrite(dir[1])
							return
						}
					}
				}()
			}
		}
	}()
	return b
}

func (b *blackhole) stall(i int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns[i].once.Do(func() { close(b.conns[i].stalled) })
}

// TestSlowReader: a receiver that stops reading makes the writer block
// (and time out at its deadline), and neither side holds more than the
// window and the send queue.
func TestSlowReader(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	c, s := dialPair(t, l, "parallel:streams=4,window=1M")
	c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	var written int64
	buf := make([]byte, 64<<10)
	var err error
	for err == nil {
		var n int
		n, err = c.Write(buf)
		written += int64(n)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a receiver that does not read: %v, want os.ErrDeadlineExceeded", err)
	}
	cs, ss := session(t, c), session(t, s)
	ss.mu.Lock()
	buffered := ss.buffered
	ss.mu.Unlock()
	cs.mu.Lock()
	queued, limit := cs.queued, cs.sendLimitLocked()
	cs.mu.Unlock()
	bound := int64(1<<20) + MaxBlock + blockCost
	t.Logf("written %d, receiver holds %d (bound %d), sender queues %d (limit %d)", written, buffered, bound, queued, limit)
	if buffered > bound {
		t.Errorf("receiver holds %d bytes, more than its window allows (%d)", buffered, bound)
	}
	if queued > limit+MaxBlock {
		t.Errorf("sender queues %d bytes, limit %d", queued, limit)
	}
	if written > bound+limit+MaxBlock {
		t.Errorf("writer got %d bytes accepted with nobody reading", written)
	}
	// Reading again lets everything through, in order.
	c.SetWriteDeadline(time.Time{})
	go func() { c.Write([]byte("end")); netconn.CloseWrite(c) }()
	got, err := io.ReadAll(s)
	if err != nil || int64(len(got)) != written+3 || !bytes.HasSuffix(got, []byte("end")) {
		t.Fatalf("after reading resumed: %d bytes (want %d), err %v", len(got), written+3, err)
	}
}

// TestIncompleteSession: a dialer that announces 4 substreams and opens
// one is dropped when the listener's handshake timeout passes, and the
// listener keeps serving others.
func TestIncompleteSession(t *testing.T) {
	id := uniqueID()
	l := listen(t, vlink.ListenConfig{HandshakeTimeout: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialDone := make(chan error, 1)
	go func() {
		d := &vlink.Dialer{Stack: vlink.MustParse("parallel:streams=4+rec:id=" + id + ",hang-after=1")}
		_, err := d.DialContext(ctx, "tcp", l.Addr().String())
		dialDone <- err
	}()
	var first net.Conn
	for first == nil {
		if cs := recordedConns(id); len(cs) > 0 {
			first = cs[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	first.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := first.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("lone substream: read %v, want io.EOF once the listener gives up", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the listener held the incomplete session for %v", d)
	}
	cancel()
	if err := <-dialDone; err == nil {
		t.Error("dial of an incomplete session succeeded")
	}
	// Still serving.
	c, s := dialPair(t, l, "parallel:streams=2")
	go c.Write([]byte("ok"))
	b := make([]byte, 2)
	if _, err := io.ReadFull(s, b); err != nil || string(b) != "ok" {
		t.Fatalf("after an incomplete session: %q, %v", b, err)
	}
}

// TestPolicy: the listener's policy bounds the substreams a dialer may
// ask for, and its key covers every substream and the session.
func TestPolicy(t *testing.T) {
	key := []byte("0123456789abcdef0123")
	l := listen(t, vlink.ListenConfig{Policy: vlink.Policy{
		Key:    key,
		Limits: map[string]vlink.Range{"parallel.streams": {Min: 1, Max: 8}},
	}})
	tests := []struct {
		name  string
		stack string
		key   []byte
		want  error
	}{
		{"within bounds with the key", "parallel:streams=8", key, nil},
		{"too many substreams", "parallel:streams=64", key, vlink.ErrNotAllowed},
		{"no key", "parallel:streams=2", nil, vlink.ErrAuth},
		{"wrong key", "parallel:streams=2", []byte("fedcba9876543210fedc"), vlink.ErrAuth},
		{"compressed session", "zstd+parallel:streams=2+lz4", key, nil},
	}
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Key: tt.key, Timeout: 10 * time.Second}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("dial: %v, want %v", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := <-accepted
			defer s.Close()
			if h := s.(*vlink.Conn).Hello(); h == nil || !h.Authenticated {
				t.Errorf("session's hello %+v, want authenticated", h)
			}
			go c.Write([]byte("hi"))
			b := make([]byte, 2)
			if _, err := io.ReadFull(s, b); err != nil || string(b) != "hi" {
				t.Fatalf("read %q, %v", b, err)
			}
		})
	}
}

// TestForwardTarget: through a gateway, the target travels in the nested
// hello of the session, once, and the listener admits it once.
func TestForwardTarget(t *testing.T) {
	var admits int
	var mu sync.Mutex
	l := listen(t, vlink.ListenConfig{
		Policy: vlink.Policy{Targets: allowAll()},
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			mu.Lock()
			admits++
			mu.Unlock()
			return nil, nil
		},
	})
	accepted := make(chan *vlink.Conn, 1)
	go func() {
		c, err := l.AcceptVLink()
		if err == nil {
			accepted <- c
		}
	}()
	d := &vlink.Dialer{Stack: vlink.MustParse("parallel:streams=4"), Via: l.Addr().String()}
	defer d.Close()
	c, err := d.Dial("tcp", "192.0.2.7:5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	if got := s.Hello().Target; got != "192.0.2.7:5432" {
		t.Errorf("target %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if admits != 1 {
		t.Errorf("Admit called %d times for one session of 4 substreams", admits)
	}
}

// TestAutoGrow: in auto mode the dialer adds substreams to a live
// session, the listener takes them in, and the stream stays intact. It
// grows by hand; when to grow is TestAutoGrowDecisions'.
func TestAutoGrow(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	c, s := dialPair(t, l, "parallel:streams=6,auto")
	cs, ss := session(t, c), session(t, s)
	if n := cs.Streams(); n != 2 {
		t.Fatalf("auto session starts with %d substreams, want 2", n)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sendSum(c, 9, 32<<20)
		if err == nil {
			err = netconn.CloseWrite(c)
		}
		done <- err
	}()
	cs.grower.grow(4)
	n, ok, err := prefixCheck(s, 9)
	if err != nil || n != 32<<20 || !ok {
		t.Fatalf("received %d bytes, in order %v, err %v", n, ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a, b := cs.Streams(), ss.Streams(); a != 6 || b != 6 {
		t.Errorf("after growing: dialer has %d substreams, listener %d, want 6", a, b)
	}
}

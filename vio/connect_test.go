package vio_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vio"
	"github.com/vlink-dev/vlink/vlink"
)

// echoServer serves every connection of l from one goroutine, the only
// one that calls the set's Wait: it posts the accepts, and writes each
// read's bytes back before the next read. The test's end closes the set,
// and with it l and every connection, and waits for the goroutine.
func echoServer(t testing.TB, l net.Listener) {
	s := vio.NewSet()
	ln, err := s.AddListener(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.PostAccept(make([]byte, 32<<10)); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := s.Wait(-1)
			if err != nil {
				return // the set is closed
			}
			switch {
			case ev.Op == vio.OpAccept && ev.Err != nil:
				t.Errorf("accept: %v", ev.Err)
				return
			case ev.Op == vio.OpAccept:
				ev.Sock.PostRead(ev.Sock.User.([]byte), 1, nil)
				ev.Listener.PostAccept(make([]byte, 32<<10))
			case ev.Op == vio.OpClose:
			case ev.Err != nil:
				ev.Sock.PostClose() // the client's end, or its failure
			case ev.Op == vio.OpRead:
				ev.Sock.PostWrite(ev.Sock.User.([]byte)[:ev.N], nil)
			case ev.Op == vio.OpWrite:
				ev.Sock.PostRead(ev.Sock.User.([]byte), 1, nil)
			}
		}
	}()
	t.Cleanup(func() {
		go s.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the echo server's set did not close: its Close waits for a posted accept")
		}
	})
}

// echoClient sends n streams of size bytes to an echo server at addr,
// over connections dialed through d, from this goroutine alone: it posts
// the connects, then on each connection a write of the stream and a read
// of its echo, and checks every echo by SHA-256.
func echoClient(t *testing.T, d vio.ContextDialer, addr string, n, size int) {
	s := vio.NewSet()
	defer s.Close()
	type stream struct{ sent, got []byte }
	for i := range n {
		st := &stream{sent: testnet.RandomBytes(size, uint64(i)), got: make([]byte, size)}
		if _, err := s.PostConnect(d, "tcp", addr, st); err != nil {
			t.Fatal(err)
		}
	}
	for closed := 0; closed < n; {
		ev, err := s.Wait(20 * time.Second)
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if ev.Err != nil {
			t.Fatalf("%v: %v", ev.Op, ev.Err)
		}
		st := ev.Sock.User.(*stream)
		switch ev.Op {
		case vio.OpConnect:
			if err := ev.Sock.PostWrite(st.sent, nil); err != nil {
				t.Fatal(err)
			}
			if err := ev.Sock.PostRead(st.got, size, nil); err != nil {
				t.Fatal(err)
			}
		case vio.OpRead:
			if sha256.Sum256(st.got) != sha256.Sum256(st.sent) {
				t.Fatalf("the echo of %d bytes differs (sha256 %s, sent %s)", size, testnet.Sum(st.got), testnet.Sum(st.sent))
			}
			ev.Sock.PostClose()
		case vio.OpClose:
			closed++
		}
	}
}

// TestEventDriven: an event-driven echo server and client, each written
// against vio alone with one goroutine calling Wait (accepts and
// connects posted like reads and writes), exchange 20 streams at once,
// over TCP and over a vlink stack.
func TestEventDriven(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen func() (net.Listener, error)
		dialer vio.ContextDialer
	}{
		{"tcp", func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }, &net.Dialer{}},
		{"vlink zstd+tcp", func() (net.Listener, error) { return vlinkListen(vlink.ListenConfig{}) }, &vlink.Dialer{Stack: vlink.MustParse("zstd")}},
		{"vlink noise+tcp", func() (net.Listener, error) {
			return vlinkListen(vlink.ListenConfig{Policy: vlink.Policy{Key: testKey}})
		}, &vlink.Dialer{Stack: vlink.MustParse("noise"), Key: testKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.listen()
			if err != nil {
				t.Fatal(err)
			}
			echoServer(t, l)
			echoClient(t, tc.dialer, l.Addr().String(), 20, 200<<10)
			if c, ok := tc.dialer.(*vlink.Dialer); ok {
				c.Close()
			}
		})
	}
}

var testKey = []byte("a pre-shared key of 32 bytes....")

// vlinkListen listens on a loopback port as lc says, but never takes a
// connection for plain because its hello is slow to come (20 dials at
// once under the race detector): the clients here always speak first.
func vlinkListen(lc vlink.ListenConfig) (net.Listener, error) {
	lc.SniffTimeout = -1
	return lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
}

// failingListener's Accept fails with err until it is closed.
type failingListener struct {
	net.Listener
	err error
}

func (l failingListener) Accept() (net.Conn, error) { return nil, l.err }

// failingDialer's dials fail with err.
type failingDialer struct{ err error }

func (d failingDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, d.err
}

// TestAcceptFails: a failed accept completes as an OpAccept event naming
// the Listener, with no Sock and the listener's error in an *OpError;
// the Listener takes the next accept.
func TestAcceptFails(t *testing.T) {
	s := newSet(t)
	boom := errors.New("boom")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.AddListener(failingListener{l, boom}, "me")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ln.PostAccept(nil); err != nil {
			t.Fatal(err)
		}
		ev := wait(t, s)
		var oe *vio.OpError
		if ev.Op != vio.OpAccept || ev.Listener != ln || ev.Sock != nil || !errors.Is(ev.Err, boom) || !errors.As(ev.Err, &oe) || oe.Op != vio.OpAccept {
			t.Fatalf("event %+v, want a failed OpAccept of the Listener with an *OpError wrapping boom", ev)
		}
	}
	if ln.User != "me" || ln.Addr().String() != l.Addr().String() {
		t.Errorf("Listener: user %v, address %v", ln.User, ln.Addr())
	}
}

// TestConnectFails: a dial that fails completes as an OpConnect event on
// the Sock PostConnect returned, with the dialer's error in an *OpError;
// the Sock is closed then.
func TestConnectFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String()
	l.Close()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		d    vio.ContextDialer
		want error
	}{
		{"refused", nil, syscall.ECONNREFUSED},
		{"dialer's error", failingDialer{boom}, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSet(t)
			k, err := s.PostConnect(tc.d, "tcp", refused, "me")
			if err != nil {
				t.Fatal(err)
			}
			if err := k.PostRead(make([]byte, 1), 1, nil); !errors.Is(err, vio.ErrNotConnected) && !errors.Is(err, net.ErrClosed) {
				t.Errorf("read posted before the connect completed: %v, want ErrNotConnected", err)
			}
			ev := wait(t, s)
			var oe *vio.OpError
			if ev.Op != vio.OpConnect || ev.Sock != k || !errors.Is(ev.Err, tc.want) || !errors.As(ev.Err, &oe) || oe.Op != vio.OpConnect {
				t.Fatalf("event %+v, want a failed OpConnect of the Sock with an *OpError wrapping %v", ev, tc.want)
			}
			if k.User != "me" || k.Conn() != nil {
				t.Errorf("Sock: user %v, connection %v", k.User, k.Conn())
			}
			if err := k.PostWrite([]byte("x"), nil); !errors.Is(err, net.ErrClosed) {
				t.Errorf("write posted after the failed connect: %v, want net.ErrClosed", err)
			}
			if err := k.PostClose(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("PostClose after the failed connect: %v, want net.ErrClosed", err)
			}
			if ev, err := s.Wait(50 * time.Millisecond); !errors.Is(err, vio.ErrTimeout) {
				t.Errorf("an event after the failed connect: %+v, %v", ev, err)
			}
		})
	}
}

// hangingDialer's dials wait for their context, and report when it was
// done; with late set, the dial then succeeds anyway, as one that
// completed just as it was cancelled does.
type hangingDialer struct {
	cancelled chan error
	late      bool
}

func (d hangingDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		d.cancelled <- errors.New("never cancelled")
		return nil, os.ErrDeadlineExceeded
	}
	d.cancelled <- ctx.Err()
	if d.late {
		a, b := net.Pipe()
		b.Close()
		return a, nil
	}
	return nil, ctx.Err()
}

// slowListener returns from an Accept that its Close interrupted only a
// moment later, as a listener with work of its own to end does.
type slowListener struct{ net.Listener }

func (l slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		time.Sleep(50 * time.Millisecond)
	}
	return c, err
}

// TestCloseInterruptsAcceptConnect: PostClose of a Listener interrupts its posted
// accept, and PostClose of a Sock its posted connect: the operation
// completes with net.ErrClosed, then the close. A connection a cancelled
// dial made anyway is closed, never handed out.
func TestCloseInterruptsAcceptConnect(t *testing.T) {
	t.Run("accept", func(t *testing.T) {
		s := newSet(t)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := s.AddListener(slowListener{l}, nil)
		if err := ln.PostAccept(nil); err != nil {
			t.Fatal(err)
		}
		if err := ln.PostAccept(nil); !errors.Is(err, vio.ErrBusy) {
			t.Errorf("a second accept posted: %v, want ErrBusy", err)
		}
		time.Sleep(20 * time.Millisecond) // the accept blocks
		if err := ln.PostClose(); err != nil {
			t.Fatal(err)
		}
		for _, want := range []vio.Op{vio.OpAccept, vio.OpClose} {
			ev := wait(t, s)
			if ev.Op != want || ev.Listener != ln || ev.Sock != nil {
				t.Fatalf("event %+v, want %v of the Listener", ev, want)
			}
			if want == vio.OpAccept && !errors.Is(ev.Err, net.ErrClosed) || want == vio.OpClose && ev.Err != nil {
				t.Fatalf("%v: %v", ev.Op, ev.Err)
			}
		}
		if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
			t.Error("the Listener's close left it listening")
		}
		if err := ln.PostAccept(nil); !errors.Is(err, net.ErrClosed) {
			t.Errorf("accept posted after the close: %v, want net.ErrClosed", err)
		}
	})
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("connect/late=%t", late), func(t *testing.T) {
			s := newSet(t)
			d := hangingDialer{cancelled: make(chan error, 1), late: late}
			k, err := s.PostConnect(d, "tcp", "192.0.2.1:9", nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := k.PostRead(make([]byte, 1), 1, nil); !errors.Is(err, vio.ErrNotConnected) {
				t.Errorf("read posted before the connect completed: %v, want ErrNotConnected", err)
			}
			if err := k.PostClose(); err != nil {
				t.Fatal(err)
			}
			if err := <-d.cancelled; !errors.Is(err, context.Canceled) {
				t.Errorf("the dial's context: %v, want it cancelled", err)
			}
			for _, want := range []vio.Op{vio.OpConnect, vio.OpClose} {
				ev := wait(t, s)
				if ev.Op != want || ev.Sock != k {
					t.Fatalf("event %+v, want %v of the Sock", ev, want)
				}
				if want == vio.OpConnect && !errors.Is(ev.Err, net.ErrClosed) || want == vio.OpClose && ev.Err != nil {
					t.Fatalf("%v: %v", ev.Op, ev.Err)
				}
			}
			if c := k.Conn(); c != nil {
				t.Errorf("the Sock holds %v after its connect was cancelled", c)
			}
		})
	}
	t.Run("set close", func(t *testing.T) {
		s := vio.NewSet()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := s.AddListener(l, nil)
		ln.PostAccept(nil)
		d := hangingDialer{cancelled: make(chan error, 1)}
		if _, err := s.PostConnect(d, "tcp", "192.0.2.1:9", nil); err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the set's Close waits for a posted accept or connect")
		}
		if err := <-d.cancelled; !errors.Is(err, context.Canceled) {
			t.Errorf("the dial's context: %v, want it cancelled", err)
		}
		if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
			t.Error("the set's close left the Listener listening")
		}
		if _, err := s.AddListener(l, nil); !errors.Is(err, net.ErrClosed) {
			t.Errorf("AddListener on a closed set: %v", err)
		}
		if _, err := s.PostConnect(nil, "tcp", l.Addr().String(), nil); !errors.Is(err, net.ErrClosed) {
			t.Errorf("PostConnect on a closed set: %v", err)
		}
	})
}

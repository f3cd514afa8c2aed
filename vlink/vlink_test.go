package vlink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var key = []byte("0123456789abcdef-test-key")

// listen starts a VLink listener on loopback and an echo-or-sink server on
// it: every accepted connection gets its bytes back, so tests check what
// the far side saw.
func listen(t *testing.T, lc vlink.ListenConfig) *vlink.Listener {
	t.Helper()
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
	return l
}

func TestDialListenMirrors(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	for _, stack := range []string{"tcp", "test-xor", "test-xor:key=3+test-filter:level=7", "test-xor+test-proxy"} {
		t.Run(stack, func(t *testing.T) {
			d := vlink.Dialer{Stack: vlink.MustParse(stack)}
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 1<<20+7)
		})
	}
}

// A plain stack sends no hello: an ordinary TCP server sees exactly the
// application's bytes.
func TestPlainStackSendsNoHello(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	d := vlink.Dialer{Stack: vlink.MustParse("tcp")}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*net.TCPConn); !ok {
		t.Errorf("plain stack returned %T, want the *net.TCPConn itself", c)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	c.Close()
	if b := <-got; string(b) != "GET / HTTP/1.0\r\n\r\n" {
		t.Fatalf("server saw %q", b)
	}
}

// Plain clients reach a VLink listener too, including silent ones whose
// protocol has the server speak first.
func TestListenerAcceptsPlain(t *testing.T) {
	l := listen(t, vlink.ListenConfig{SniffTimeout: 50 * time.Millisecond})
	for _, first := range []string{"hello", "\x89PNG not vlink", "\x89VLK\r\nX"} {
		t.Run(first, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(first))
			c.(*net.TCPConn).CloseWrite()
			b, err := io.ReadAll(c)
			if err != nil || string(b) != first {
				t.Fatalf("echo = %q, %v; want %q", b, err, first)
			}
		})
	}
	for _, prefix := range []string{"\x89", "\x89VLK\r\n\x1a"} {
		// A strict prefix of the magic, then silence: the client waits for
		// the server. Handed over as plain one sniff timeout after its
		// last byte, not refused at the handshake timeout.
		t.Run(fmt.Sprintf("prefix %q then silent", prefix), func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(prefix))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, len(prefix))
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != prefix {
				t.Fatalf("echo = %q, %v; want the prefix back well before the handshake timeout", buf, err)
			}
		})
	}
	t.Run("silent", func(t *testing.T) {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		time.Sleep(100 * time.Millisecond) // past the sniff timeout, as an SSH client waiting for a banner
		c.Write([]byte("late"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "late" {
			t.Fatalf("echo = %q, %v", buf, err)
		}
	})
}

// The sniff reads as much of the magic as has come: a hello in pieces is
// still a hello, and a client whose bytes leave the magic in a later
// piece is plain, with every byte it sent relayed.
func TestSniffInPieces(t *testing.T) {
	l := listen(t, vlink.ListenConfig{SniffTimeout: time.Second})
	hello := vlink.PlainHello(context.Background(), "", "")
	for _, tc := range []struct {
		name   string
		pieces []string
		hello  bool   // answered with an accept
		echo   string // then echoed
	}{
		{"hello byte by byte", strings.Split(string(hello)+"ping", ""), true, "ping"},
		{"hello split in its magic", []string{string(hello[:3]), string(hello[3:]) + "ping"}, true, "ping"},
		{"plain after three bytes of magic", []string{"\x89VL", "KX and more"}, false, "\x89VLKX and more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, p := range tc.pieces {
				if _, err := c.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond) // each its own segment, read on its own
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if tc.hello {
				if err := vlink.ReadPlainAnswer(c, hello); err != nil {
					t.Fatalf("answer to a hello in pieces: %v", err)
				}
			}
			got := make([]byte, len(tc.echo))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != tc.echo {
				t.Fatalf("echo %q, %v; want %q", got, err, tc.echo)
			}
		})
	}
}

// A plain client whose first byte is not the magic's leaves all its bytes
// in its socket: the accepted connection is the *net.TCPConn itself, which
// can be handed on (vlink exec passes its descriptor to a server).
func TestPlainUntouched(t *testing.T) {
	lc := vlink.ListenConfig{SniffTimeout: 50 * time.Millisecond}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct {
		name, send string
		untouched  bool
	}{
		{"text", "GET / HTTP/1.0\r\n\r\n", true},
		{"silent", "", true},
		{"magic's first byte", "\x89PNG", false}, // read to tell it from a hello: relayed with its prefix
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(tc.send))
			a, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			inner := a.(*vlink.Conn).UnwrapConn()
			if _, ok := inner.(*net.TCPConn); ok != tc.untouched {
				t.Fatalf("accepted %T below vlink.Conn, want the *net.TCPConn itself: %v", inner, tc.untouched)
			}
			c.Write([]byte("!"))
			c.(*net.TCPConn).CloseWrite()
			if b, err := io.ReadAll(a); err != nil || string(b) != tc.send+"!" {
				t.Fatalf("read %q, %v; want %q", b, err, tc.send+"!")
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	tests := []struct {
		name    string
		policy  vlink.Policy
		stack   string
		via     bool
		key     []byte
		is      error
		code    vlink.RefuseCode
		mention string
	}{
		{"layer not allowed", vlink.Policy{Layers: []string{"test-filter"}}, "test-xor", false, nil, vlink.ErrNotAllowed, vlink.CodeLayer, "test-xor"},
		{"param above limit", vlink.Policy{Limits: map[string]vlink.Range{"test-xor.key": {1, 10}}}, "test-xor:key=200", false, nil, vlink.ErrNotAllowed, vlink.CodeParam, "outside this listener's [1, 10]"},
		{"default above limit", vlink.Policy{Limits: map[string]vlink.Range{"test-xor.key": {1, 10}}}, "test-xor", false, nil, vlink.ErrNotAllowed, vlink.CodeParam, "key=90"},
		{"too many layers", vlink.Policy{MaxLayers: 1}, "test-xor+test-xor", false, nil, vlink.ErrNotAllowed, vlink.CodeLayer, "at most 1"},
		{"key required", vlink.Policy{Key: key}, "test-xor", false, nil, vlink.ErrAuth, vlink.CodeAuthRequired, "pre-shared key"},
		{"wrong key", vlink.Policy{Key: key}, "test-xor", false, []byte("another key of 16+ bytes"), vlink.ErrAuth, vlink.CodeAuthFailed, "does not match"},
		{"no forwarding", vlink.Policy{}, "test-xor", true, nil, vlink.ErrNotAllowed, vlink.CodeTarget, "does not forward"},
		{"target not allowed", vlink.Policy{Targets: []selector.Rule{{Host: "db.internal", Ports: "5432"}}}, "test-xor", true, nil, vlink.ErrNotAllowed, vlink.CodeTarget, "not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Room for more than the two expected: an unexpected one is
			// reported below, never a listener blocked in Observe.
			observed := make(chan error, 8)
			l := listen(t, vlink.ListenConfig{Policy: tt.policy, Observe: func(c *vlink.Conn, took time.Duration, err error) {
				if (c == nil) == (err == nil) || took <= 0 {
					t.Errorf("Observe(%v, %v, %v): want a connection or an error, and the time taken", c, took, err)
				}
				observed <- err
			}})
			d := vlink.Dialer{Stack: vlink.MustParse(tt.stack), Key: tt.key}
			target := l.Addr().String()
			if tt.via {
				d.Via, target = l.Addr().String(), "example.com:80"
			}
			c, err := d.Dial("tcp", target)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var re *vlink.RefusedError
			if !errors.Is(err, tt.is) || !errors.Is(err, vlink.ErrRefused) || !errors.As(err, &re) || re.Code != tt.code {
				t.Fatalf("err = %v, want a refusal %v matching %v", err, tt.code, tt.is)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" {
				t.Fatalf("err = %#v, want a *net.OpError", err)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.mention)
			}
			// The listener keeps serving after a refusal. (A plain dial to
			// a keyed listener would be one more refusal, observed when
			// its sniff ends: keyed listeners get a keyed dial.)
			ok := vlink.Dialer{Stack: vlink.MustParse("tcp")}
			if tt.policy.Key != nil {
				ok = vlink.Dialer{Stack: vlink.MustParse("test-filter"), Key: key}
			}
			c, err = ok.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("listener stopped serving: %v", err)
			}
			testnet.RoundTrip(t, c, 1000)
			c.Close()
			// Each handshake runs on its own goroutine: the refusal may
			// be observed after the accept that followed it.
			var refusals, accepts int
			for range 2 {
				switch err := <-observed; {
				case err == nil:
					accepts++
				case errors.As(err, &re) && re.Code == tt.code:
					refusals++
					// Observe is told the stack the hello claimed.
					var he *vlink.HandshakeError
					if !errors.As(err, &he) {
						t.Errorf("Observe was told %#v, want a *vlink.HandshakeError", err)
					} else if s, perr := vlink.Parse(he.Stack); perr != nil || s.Layers[0].Name != d.Stack.Layers[0].Name {
						t.Errorf("Observe was told the stack %q (%v), want the dialer's, %s", he.Stack, perr, d.Stack)
					}
				default:
					t.Errorf("Observe was told %v, want a refusal %v or an accept", err, tt.code)
				}
			}
			if refusals != 1 || accepts != 1 {
				t.Errorf("Observe saw %d refusals and %d accepts, want 1 and 1", refusals, accepts)
			}
			select {
			case err := <-observed:
				t.Errorf("Observe was told more: %v", err)
			default:
			}
		})
	}
}

func TestAuthentication(t *testing.T) {
	observed := make(chan error, 2)
	l := listen(t, vlink.ListenConfig{Policy: vlink.Policy{Key: key}, Observe: func(_ *vlink.Conn, _ time.Duration, err error) { observed <- err }})
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Key: key}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 100)
	c.Close()

	// A plain client cannot bypass the key: the listener closes it.
	pc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pc.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	wantClosed(t, pc, "a plain client against a keyed listener")
	// The keyed handshake was observed before its connection was
	// queued for Accept, so before the round trip ended and the plain
	// client came: the two arrive in this order.
	if err := <-observed; err != nil {
		t.Errorf("Observe was told %v of the keyed handshake", err)
	}
	if err := <-observed; !errors.Is(err, vlink.ErrPlainRefused) {
		t.Errorf("Observe was told %v of the plain client, want ErrPlainRefused", err)
	}

	// A dialer with a key refuses a listener that cannot prove it.
	open := listen(t, vlink.ListenConfig{})
	if _, err := d.Dial("tcp", open.Addr().String()); !errors.Is(err, vlink.ErrAuth) {
		t.Fatalf("dial to a listener without the key = %v, want ErrAuth", err)
	}
}

// A captured hello and proof replayed on a new connection fail, because
// the challenge is fresh: with the key, and with a node's key.
func TestReplayFails(t *testing.T) {
	l := listen(t, vlink.ListenConfig{Policy: vlink.Policy{Key: key}})
	tests := []struct {
		name   string
		dialer *vlink.Dialer
		want   string // in the refusal of the replay
	}{
		{"key", &vlink.Dialer{Stack: vlink.MustParse("test-xor"), Key: key}, "does not match this listener's key"},
		{"node", &vlink.Dialer{Stack: vlink.MustParse("test-xor"), Node: "alice", Key: vlink.NodeKey(key, "alice")}, `does not match the key of node "alice"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Record what an honest dialer sends through a recording proxy.
			rec := &recorder{}
			pl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer pl.Close()
			proxied := make(chan struct{})
			go func() {
				defer close(proxied)
				c, err := pl.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				s, err := net.Dial("tcp", l.Addr().String())
				if err != nil {
					return
				}
				defer s.Close()
				go io.Copy(c, s)
				io.Copy(io.MultiWriter(s, rec), c)
			}()
			c, err := tt.dialer.Dial("tcp", pl.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			<-proxied
			captured := rec.bytes()

			// Replay it byte for byte.
			r, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			r.Write(captured)
			r.SetReadDeadline(time.Now().Add(5 * time.Second))
			answer, _ := io.ReadAll(r)
			// challenge frame, then a refusal with CodeAuthFailed.
			if !bytes.Contains(answer, []byte(tt.want)) {
				t.Fatalf("replayed handshake got %q, want an authentication failure", answer)
			}
		})
	}
}

type recorder struct {
	mu sync.Mutex
	b  []byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.b = append(r.b, p...)
	r.mu.Unlock()
	return len(p), nil
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.b...)
}

// Malformed hellos get a refusal for that connection only; the listener
// keeps serving others, including while a slow dialer holds a handshake.
func TestMalformedHellos(t *testing.T) {
	l := listen(t, vlink.ListenConfig{HandshakeTimeout: 300 * time.Millisecond})
	magic := "\x89VLK\r\n\x1a\n"
	tests := []struct {
		name, in, want string
	}{
		{"version", magic + "\x07\x01\x00\x00", "version"},
		{"oversized", magic + "\x01\x01\xff\xff", "exceeds"},
		{"garbage fields", magic + "\x01\x01\x00\x03\x63\x00\x00", "unexpected field"},
		{"unknown layer", magic + "\x01\x01\x00\x07\x01\x00\x04nope", "not allowed"},
		{"factory asked", magic + "\x01\x01\x00\x06\x01\x00\x03tcp", "not allowed"},
		{"bad param", magic + "\x01\x01\x00\x0f\x01\x00\x0ctest-xor:k=1", "unknown parameter"},
	}
	slow, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// The magic and a hello's first byte, and never more: a hello stalled
	// (a strict prefix of the magic alone would be a plain client's).
	slow.Write([]byte(magic + "\x01"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte(tt.in))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			answer, _ := io.ReadAll(c)
			if !strings.Contains(string(answer), tt.want) {
				t.Fatalf("answer %q, want a refusal mentioning %q", answer, tt.want)
			}
			good := vlink.Dialer{Stack: vlink.MustParse("test-xor")}
			gc, err := good.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("listener stopped serving: %v", err)
			}
			testnet.RoundTrip(t, gc, 10)
			gc.Close()
		})
	}
	wantClosed(t, slow, "a handshake stalled past the handshake timeout")
}

// wantClosed checks that the listener closes c (an end of stream or a
// reset, and no byte) within 5 seconds: well past the handshake timeouts
// the tests set, well short of DefaultHandshakeTimeout, so a connection
// that only the default timeout would close fails too.
func wantClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	if err := readEnd(c); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// readEnd reads from c and says what is wrong unless it ends (EOF or a
// reset, no byte) within 5 seconds.
func readEnd(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
		return fmt.Errorf("read %d bytes, %v; want the connection closed by the listener (EOF or a reset)", n, err)
	}
	return nil
}

func TestDialNotVLink(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if i == 0 {
				c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			}
			c.Close()
		}
	}()
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor")}
	for i := 0; i < 2; i++ {
		if _, err := d.Dial("tcp", ln.Addr().String()); !errors.Is(err, vlink.ErrNotVLink) {
			t.Fatalf("dial %d to a plain server = %v, want ErrNotVLink", i, err)
		}
	}
	<-done
}

func TestDialContextCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor")}
	start := time.Now()
	_, err = d.DialContext(ctx, "tcp", ln.Addr().String())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("cancel did not interrupt the handshake")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err = d.DialContext(ctx, "tcp", ln.Addr().String()); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, errTimeout) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
}

var errTimeout = context.DeadlineExceeded

func TestAdmitAndForwardTarget(t *testing.T) {
	lc := vlink.ListenConfig{
		// Plain refused: a hello slowed past the sniff timeout must not be
		// taken for a plain connection, which has no hello.
		Policy: vlink.Policy{Targets: []selector.Rule{{Host: "*.allowed", Ports: "1-65535"}}, Plain: vlink.PlainRefuse},
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			if strings.HasPrefix(h.Target, "down.") {
				return nil, &vlink.RefusedError{Code: vlink.CodeUnreachable, Reason: "connection refused"}
			}
			return h.Target, nil
		},
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		c, err := l.AcceptVLink()
		if err != nil {
			got <- err.Error()
			return
		}
		got <- c.Hello().Target + " " + c.Admitted().(string) + " " + c.Hello().Stack.String()
		c.Close()
	}()
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor:key=5"), Via: l.Addr().String()}
	if _, err := d.Dial("tcp", "down.allowed:80"); !errors.Is(err, vlink.ErrUnreachable) {
		t.Fatalf("dial to an unreachable target = %v, want ErrUnreachable", err)
	}
	c, err := d.Dial("tcp", "up.allowed:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s := <-got; s != "up.allowed:80 up.allowed:80 test-xor:key=5" {
		t.Fatalf("listener saw %q", s)
	}
}

func TestListenerClose(t *testing.T) {
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A connection stuck in its handshake is closed by Close.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("\x89VLK"))
	errc := make(chan error, 1)
	go func() { _, err := l.Accept(); errc <- err }()
	// Close must end the handshake at once, not leave it to the
	// handshake timeout, which Close would then wait for: read before.
	ended := make(chan error, 1)
	go func() { ended <- readEnd(c) }()
	time.Sleep(20 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("a connection in its handshake when the listener closed: %v", err)
	}
}

func TestForwardTargetMustBeNumeric(t *testing.T) {
	l := listen(t, vlink.ListenConfig{Policy: vlink.Policy{Targets: []selector.Rule{{Host: "*"}}}})
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Via: l.Addr().String()}
	for _, target := range []string{"example.com:https", "example.com:0", ":80"} {
		if _, err := d.Dial("tcp", target); !errors.Is(err, vlink.ErrBadHello) {
			t.Errorf("target %q: err = %v, want a malformed-hello refusal", target, err)
		}
	}
}

// TestListenerHandle: with Handle set, each connection goes to it on the
// goroutine of its handshake, never to Accept, and Close does not wait
// for a Handle still running: the listener let go of the connection.
func TestListenerHandle(t *testing.T) {
	release := make(chan struct{})
	handled := make(chan *vlink.Conn, 1)
	lc := vlink.ListenConfig{Handle: func(c *vlink.Conn) {
		handled <- c
		io.Copy(c, c)
		c.Close()
		<-release
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)
	accepted := make(chan error, 1)
	go func() { _, err := l.Accept(); accepted <- err }()

	d := vlink.Dialer{Stack: vlink.MustParse("test-xor")}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	if hc := <-handled; hc.Hello() == nil || hc.Hello().Stack.String() != "test-xor" {
		t.Errorf("Handle got %v, want the connection with its hello (test-xor)", hc.Hello())
	}

	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits for Handle to return")
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept = %v, want net.ErrClosed (connections go to Handle only)", err)
	}
}

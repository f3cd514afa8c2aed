package evloop

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// lineGreeter takes connections that open with "GO port\n": they go to
// that port on 127.0.0.1, answered "OK\n" once it is connected, or
// "NO\n" when it cannot be; it hands off all else.
type lineGreeter struct{ deadline time.Duration }

func (g lineGreeter) Greet(c *Conn, first []byte) (Greeting, bool) {
	line, _, found := bytes.Cut(first, []byte("\n"))
	port, err := strconv.Atoi(string(bytes.TrimPrefix(line, []byte("GO "))))
	if !found || !bytes.HasPrefix(line, []byte("GO ")) || err != nil {
		return Greeting{}, false
	}
	gr := Greeting{Target: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port)),
		Consume: len(line) + 1, Reply: []byte("OK\n")}
	if g.deadline > 0 {
		gr.Deadline = time.Now().Add(g.deadline)
	}
	return gr, true
}

func (lineGreeter) Refusal(*Conn, error) []byte { return []byte("NO\n") }

func startGreeter(t *testing.T, g Greeter, r *recorder) *Loop {
	t.Helper()
	return listenLoop(t, Config{Greeter: g, GreetTimeout: 100 * time.Millisecond}, r)
}

// accepted returns the next connection lp hands off.
func accepted(t *testing.T, lp *Loop) net.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := lp.Accept()
		got <- c
	}()
	select {
	case c := <-got:
		if c == nil {
			t.Fatal("Accept failed")
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("nothing handed off")
	}
	return nil
}

// TestGreeter: a greeted connection gets its reply, then its bytes
// after the greeting relayed both ways; the others are handed off to
// Accept with every byte unread, the silent ones after GreetTimeout.
func TestGreeter(t *testing.T) {
	target := serve(t, func(c *net.TCPConn) { io.Copy(c, c); c.CloseWrite() })
	r := newRecorder()
	lp := startGreeter(t, lineGreeter{}, r)

	t.Run("greeted", func(t *testing.T) {
		data := testnet.RandomBytes(1<<20, 4) // past BulkBytes: moves to the splicing relay
		c := dial(t, lp)
		// The greeting and the first bytes after it in one write.
		go func() {
			c.Write(append([]byte("GO "+strconv.Itoa(int(target.Port()))+"\n"), data...))
			c.CloseWrite()
		}()
		got, err := io.ReadAll(c)
		if err != nil || !bytes.HasPrefix(got, []byte("OK\n")) || testnet.Sum(got[3:]) != testnet.Sum(data) {
			t.Fatalf("client got %d bytes (reply %q), err %v; want OK and %d bytes echoed (%s)", len(got), got[:min(3, len(got))], err, len(data), testnet.Sum(data))
		}
		if e := r.wait(t); e.err != nil || e.up != int64(len(data)) || e.down != int64(len(data)) {
			t.Errorf("Ended: up %d down %d err %v, want %d each way, nil", e.up, e.down, e.err, len(data))
		}
	})
	for _, tc := range []struct {
		name, sent string
		silent     time.Duration // at least this long before the hand-off
	}{
		{"plain bytes", "GET / HTTP/1.0\r\n\r\n", 0},
		{"a greeting cut short", "GO 12", 0}, // the Greeter sees it once: the long way waits for the rest
		{"silent", "", 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c := dial(t, lp)
			c.Write([]byte(tc.sent))
			h := accepted(t, lp)
			if took := time.Since(start); took < tc.silent {
				t.Errorf("handed off after %v, want GreetTimeout's %v", took, tc.silent)
			}
			if h.RemoteAddr().String() != c.LocalAddr().String() {
				t.Errorf("handed off %v, want the client's %v", h.RemoteAddr(), c.LocalAddr())
			}
			// Every byte still there, and the connection the client's.
			c.Write([]byte("!"))
			c.CloseWrite()
			got, err := io.ReadAll(h)
			if err != nil || string(got) != tc.sent+"!" {
				t.Errorf("handed-off connection read %q, %v; want %q", got, err, tc.sent+"!")
			}
		})
	}
}

// TestGreeterDialFailure: a greeted connection whose target refuses gets
// the Greeter's refusal and a clean end; one that hangs up while its
// target does not answer ends the connect at once.
func TestGreeterDialFailure(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		closed := l.Addr().(*net.TCPAddr).Port
		l.Close()
		r := newRecorder()
		lp := startGreeter(t, lineGreeter{}, r)
		c := dial(t, lp)
		c.Write([]byte("GO " + strconv.Itoa(closed) + "\n"))
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "NO\n" {
			t.Errorf("client got %q, %v; want the refusal and a clean end", got, err)
		}
		if e := r.wait(t); !errors.Is(e.err, syscall.ECONNREFUSED) {
			t.Errorf("Dialed: %v, want ECONNREFUSED", e.err)
		}
	})
	full := int(testnet.UnansweredPort(t))
	t.Run("timeout", func(t *testing.T) {
		r := newRecorder()
		lp := startGreeter(t, lineGreeter{deadline: 300 * time.Millisecond}, r)
		c := dial(t, lp)
		c.Write([]byte("GO " + strconv.Itoa(full) + "\n"))
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "NO\n" {
			t.Errorf("client got %q, %v; want the refusal and a clean end", got, err)
		}
		if e := r.wait(t); !errors.Is(e.err, os.ErrDeadlineExceeded) {
			t.Errorf("Dialed: %v, want a timeout", e.err)
		}
	})
	for _, tc := range []struct {
		name  string
		after string // sent after the greeting
		leave func(c *net.TCPConn)
	}{
		{"client left", "", func(c *net.TCPConn) { c.Close() }},
		{"client reset", "", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }},
		{"client reset after its request", "ping", func(c *net.TCPConn) { c.SetLinger(0); c.Close() }},
		{"client reset after a half-close", "ping", func(c *net.TCPConn) {
			c.CloseWrite()
			time.Sleep(50 * time.Millisecond)
			c.SetLinger(0)
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			lp := startGreeter(t, lineGreeter{}, r) // no deadline: only the hang-up ends it
			c := dial(t, lp)
			c.Write([]byte("GO " + strconv.Itoa(full) + "\n" + tc.after))
			time.Sleep(50 * time.Millisecond)
			tc.leave(c)
			if e := r.wait(t); !errors.Is(e.err, ErrClientLeft) {
				t.Errorf("Dialed: %v, want ErrClientLeft", e.err)
			}
		})
	}
	// A client that sends its request and half-closes before the target
	// answers, as `nc -N` does, waits for its answer as over TCP.
	t.Run("half-closed after its request", func(t *testing.T) {
		r := newRecorder()
		lp := startGreeter(t, lineGreeter{}, r)
		target, open := latePort(t)
		c := dial(t, lp)
		c.Write([]byte("GO " + strconv.Itoa(int(target.Port())) + "\nping"))
		c.CloseWrite()
		time.Sleep(100 * time.Millisecond) // the loop sees the end while it connects
		open()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if got, err := io.ReadAll(c); err != nil || string(got) != "OK\nping" {
			t.Errorf("client got %q, %v; want \"OK\\nping\" and a clean end", got, err)
		}
		if e := r.wait(t); e.err != nil || e.up != 4 || e.down != 4 {
			t.Errorf("Ended: up %d down %d err %v, want 4 each way, nil", e.up, e.down, e.err)
		}
	})
}

// latePort returns the address of a listener whose queue is full, so
// that a connect to it waits, and a function that starts serving it (an
// echo): the connect then completes with its next SYN, a second or so
// after the first.
func latePort(t *testing.T) (netip.AddrPort, func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "late")
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	var fill []net.Conn
	for range 2 { // a backlog of 0 still queues one; fill it
		c, err := net.DialTimeout("tcp", addr.String(), time.Second)
		if err != nil {
			break
		}
		fill = append(fill, c)
	}
	t.Cleanup(func() {
		for _, c := range fill {
			c.Close()
		}
	})
	return addr, func() {
		for _, c := range fill {
			c.Close() // its echo ends at once
		}
		testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c); c.(*net.TCPConn).CloseWrite() })
	}
}

// TestGreeterClose: Close resets the connections still silent and those
// handed off but not accepted; Accept then fails with net.ErrClosed.
func TestGreeterClose(t *testing.T) {
	lp := listenLoop(t, Config{Greeter: lineGreeter{}, GreetTimeout: time.Hour}, newRecorder())
	silent, handed := dial(t, lp), dial(t, lp)
	handed.Write([]byte("plain"))
	// The plain one is handed off at once; wait for it to be queued.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		lp.mu.Lock()
		n := len(lp.handed)
		lp.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the plain connection was not handed off")
		}
	}
	lp.Close()
	for name, c := range map[string]*net.TCPConn{"silent": silent, "handed off": handed} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s connection after Close: %v, want a reset", name, err)
		}
	}
	if _, err := lp.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// TestGreeterHandOff: HandOff gets the connections the Greeter does not
// take, every byte unread; those it declines go to Accept.
func TestGreeterHandOff(t *testing.T) {
	handed := make(chan net.Conn, 1)
	var decline atomic.Bool
	lp := listenLoop(t, Config{Greeter: lineGreeter{}, HandOff: func(c net.Conn) bool {
		if decline.Load() {
			return false
		}
		handed <- c
		return true
	}}, newRecorder())
	c := dial(t, lp)
	c.Write([]byte("plain"))
	var h net.Conn
	select {
	case h = <-handed:
		defer h.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("nothing handed off")
	}
	c.CloseWrite()
	if got, err := io.ReadAll(h); err != nil || string(got) != "plain" {
		t.Errorf("handed-off connection read %q, %v; want \"plain\"", got, err)
	}
	decline.Store(true)
	c = dial(t, lp)
	c.Write([]byte("declined"))
	c.CloseWrite()
	if got, err := io.ReadAll(accepted(t, lp)); err != nil || string(got) != "declined" {
		t.Errorf("declined connection read %q, %v; want \"declined\"", got, err)
	}
}

// TestGreeterMaxConnecting: with MaxConnecting connects in progress, the
// next greeting is not read: its connection is handed off, bytes unread;
// once a connect ends, greetings are taken again.
func TestGreeterMaxConnecting(t *testing.T) {
	target := serve(t, func(c *net.TCPConn) { io.Copy(c, c); c.CloseWrite() })
	full := strconv.Itoa(int(testnet.UnansweredPort(t)))
	r := &greeted{recorder: newRecorder(), took: make(chan struct{}, 10)}
	lp := listenLoop(t, Config{Greeter: lineGreeter{}, MaxConnecting: 1}, r)

	stuck := dial(t, lp)
	stuck.Write([]byte("GO " + full + "\n"))
	select {
	case <-r.took: // greeted, and connecting
	case <-time.After(10 * time.Second):
		t.Fatal("the first connection was not greeted")
	}
	over := dial(t, lp)
	over.Write([]byte("GO " + full + "\n"))
	h := accepted(t, lp)
	if h.RemoteAddr().String() != over.LocalAddr().String() {
		t.Fatalf("handed off %v, want the second client's %v", h.RemoteAddr(), over.LocalAddr())
	}
	over.CloseWrite()
	if got, err := io.ReadAll(h); err != nil || string(got) != "GO "+full+"\n" {
		t.Errorf("handed-off connection read %q, %v; want its greeting unread", got, err)
	}

	stuck.Close()
	if e := r.wait(t); !errors.Is(e.err, ErrClientLeft) {
		t.Fatalf("Dialed: %v, want ErrClientLeft", e.err)
	}
	c := dial(t, lp)
	c.Write([]byte("GO " + strconv.Itoa(int(target.Port())) + "\nping"))
	c.CloseWrite()
	if got, err := io.ReadAll(c); err != nil || string(got) != "OK\nping" {
		t.Errorf("after the connect ended, client got %q, %v; want it greeted: \"OK\\nping\"", got, err)
	}
}

// greeted is a recorder that signals each connection its Greeter took.
type greeted struct {
	*recorder
	took chan struct{}
}

func (g *greeted) Accepted(c *Conn) bool {
	g.took <- struct{}{}
	return g.recorder.Accepted(c)
}

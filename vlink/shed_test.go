package vlink_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// TestSilentDialersDoNotStall fills every handshake slot of a listener,
// several times over, with dialers that open a handshake and go silent
// (as an attacker holding the port would), then dials as a legitimate
// client holding the key: it must get through at once, not after the
// handshake timeout, whether it comes from another address or from the
// attacker's own.
// magic opens a VLink hello (vlink/frame.go).
const magic = "\x89VLK\r\n\x1a\n"

func TestSilentDialersDoNotStall(t *testing.T) {
	const (
		slots   = 16
		hostile = 4 * slots
		timeout = time.Minute // what a waiting client would wait
		prompt  = 5 * time.Second
	)
	for _, tc := range []struct {
		name     string
		send     string // what each hostile dialer sends before going silent
		attacker string // its address; the legitimate client dials from 127.0.0.1
	}{
		{"magic, then silence", magic, "127.0.0.2"},
		{"nothing", "", "127.0.0.2"},
		{"half a hello", magic + "\x01\x01\x00\x28\x01", "127.0.0.2"},
		{"magic, then silence, from the client's address", magic, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, vlink.ListenConfig{
				Policy:           vlink.Policy{Key: key},
				HandshakeTimeout: timeout,
				SniffTimeout:     -1, // silence never makes a connection plain
				MaxHandshakes:    slots,
			})
			attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.attacker)}}
			for range hostile {
				c, err := attacker.Dial("tcp", l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Write([]byte(tc.send)); err != nil {
					t.Fatal(err)
				}
			}
			d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: timeout}
			ctx, cancel := context.WithTimeout(context.Background(), prompt)
			defer cancel()
			start := time.Now()
			c, err := d.DialContext(ctx, "tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("dial with %d silent dialers holding %d slots: %v after %v", hostile, slots, err, time.Since(start))
			}
			defer c.Close()
			t.Logf("connected in %v", time.Since(start))
			testnet.RoundTrip(t, c, 64<<10)
		})
	}
}

// TestSheddingWithoutChurn: dialers of one address that open more
// handshakes than there are slots and go silent are parked, not closed
// (closing them would only make them reconnect, a flood the accept loop
// spends itself on); a client from another address still gets a slot at
// once, which costs the parked address one connection; parked
// connections are closed when their handshake time is up.
func TestSheddingWithoutChurn(t *testing.T) {
	const (
		slots   = 8
		hostile = 5 * slots
		timeout = 2 * time.Second
	)
	l := listen(t, vlink.ListenConfig{
		Policy:           vlink.Policy{Key: key},
		HandshakeTimeout: timeout,
		SniffTimeout:     -1,
		MaxHandshakes:    slots,
	})
	attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var conns []net.Conn
	for range hostile {
		c, err := attacker.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(magic)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// closed counts the hostile connections the listener has closed.
	closed := func() int {
		n := 0
		for _, c := range conns {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				n++
			}
		}
		return n
	}
	// atLeast waits a while for want of them to be closed (a FIN may
	// take a moment on a loaded machine), then counts them once more.
	atLeast := func(want int) int {
		for deadline := time.Now().Add(2 * time.Second); closed() < want && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		return closed()
	}
	time.Sleep(200 * time.Millisecond) // the listener accepts them all
	if n := closed(); n != 0 {
		t.Fatalf("the listener closed %d of %d silent connections from one address; want them parked", n, hostile)
	}
	d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: timeout}
	start := time.Now()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial beside %d parked connections: %v", hostile-slots, err)
	}
	t.Logf("connected in %v", time.Since(start))
	testnet.RoundTrip(t, c, 1<<10)
	c.Close()
	if n := atLeast(1); n != 1 {
		t.Fatalf("%d silent connections closed for one client; want 1", n)
	}
	time.Sleep(timeout + 4*sweepEvery)
	if n := atLeast(hostile); n != hostile {
		t.Fatalf("%d of %d silent connections closed once their handshake time was up", n, hostile)
	}

	// Closing the listener closes what it parked, at once.
	conns = conns[:0]
	for range hostile {
		c, err := attacker.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(magic))
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond)
	if n := closed(); n != 0 {
		t.Fatalf("%d of %d new silent connections closed; want them held", n, hostile)
	}
	l.Close()
	if n := atLeast(hostile); n != hostile {
		t.Fatalf("%d of %d silent connections closed with the listener", n, hostile)
	}
}

// sweepEvery is vlink's sweep period for parked connections.
const sweepEvery = 50 * time.Millisecond

// silentDialer dials l from the address from, sends the magic and goes silent,
// as a dialer holding a handshake slot would.
func silentDialer(t *testing.T, l net.Listener, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(magic)); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin reports whether the listener closed c within d: c then
// reads an end of stream or an error rather than reaching its deadline.
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestShedTheBusiestSource: when every slot is taken, the connection
// that gives way is one of the source that holds the most slots, though
// another source's is older: a dialer cannot push out other sources'
// handshakes by opening more of its own.
func TestShedTheBusiestSource(t *testing.T) {
	const slots = 4
	l := listen(t, vlink.ListenConfig{
		Policy:           vlink.Policy{Key: key},
		HandshakeTimeout: time.Minute,
		SniffTimeout:     -1,
		MaxHandshakes:    slots,
	})
	// The oldest slot is the lone one's; the busy source holds the rest.
	// The listener accepts in the order dialed, so all are in their slots
	// before the client's connection is accepted.
	lone := silentDialer(t, l, "127.0.0.3")
	var busy []net.Conn
	for range slots - 1 {
		busy = append(busy, silentDialer(t, l, "127.0.0.2"))
	}
	d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("a client from a third address, all %d slots taken: %v", slots, err)
	}
	defer c.Close()
	testnet.RoundTrip(t, c, 1<<10)
	// The slot was made before the client's handshake began.
	if closedWithin(lone, 100*time.Millisecond) {
		t.Error("the lone source's connection was shed; want one of the source holding 3 slots")
	}
	shed := 0
	for _, b := range busy {
		if closedWithin(b, 100*time.Millisecond) {
			shed++
		}
	}
	if shed != 1 {
		t.Errorf("%d connections of the source holding 3 slots were shed, want 1", shed)
	}
}

// acceptSignal is a listener that says each time Accept is called: the
// accept loop calls it again only once it has given the previous
// connection a slot or parked it.
type acceptSignal struct {
	net.Listener
	calls chan struct{}
}

func (l acceptSignal) Accept() (net.Conn, error) {
	l.calls <- struct{}{}
	return l.Listener.Accept()
}

// TestAuthenticatedNotShed: a handshake past its proof of the key keeps
// its slot, even when every slot is taken and a client from another
// address arrives: that client waits (parked) for a slot to free rather
// than cutting an authenticated client's handshake short.
func TestAuthenticatedNotShed(t *testing.T) {
	const slots = 2
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepts := make(chan struct{}, 16)
	admitted := make(chan struct{}, 16)
	release := make(chan struct{})
	lc := vlink.ListenConfig{
		Policy:           vlink.Policy{Key: key},
		HandshakeTimeout: time.Minute,
		SniffTimeout:     -1,
		MaxHandshakes:    slots,
		// Admit runs past the proof of the key: the handshakes in it
		// are authenticated, and hold their slots until released.
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			admitted <- struct{}{}
			select {
			case <-release:
				return nil, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	}
	l, err := lc.NewListener(acceptSignal{inner, accepts})
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
	dial := func(from string) <-chan error {
		errc := make(chan error, 1)
		go func() {
			d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter+tcp:local=" + from), Timeout: 30 * time.Second}
			c, err := d.Dial("tcp", l.Addr().String())
			if err == nil {
				err = testnet.Echoed(c, 1<<10)
				c.Close()
			}
			errc <- err
		}()
		return errc
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("waited 10 s for %s", what)
		}
	}
	var held []<-chan error
	for i := range slots {
		held = append(held, dial("127.0.0.2"))
		wait(admitted, fmt.Sprintf("authenticated handshake %d in Admit", i+1))
	}
	late := dial("127.0.0.1")
	// Accept is called once before each connection and once after the
	// last: its call after the late client's says that one was placed.
	for i := range slots + 2 {
		wait(accepts, fmt.Sprintf("Accept call %d", i+1))
	}
	select {
	case <-admitted:
		t.Error("the late client's handshake reached Admit with every slot held by an authenticated handshake")
	default:
	}
	close(release)
	for i, errc := range held {
		if err := <-errc; err != nil {
			t.Errorf("authenticated client %d: %v (want it kept while the late client waits)", i+1, err)
		}
	}
	if err := <-late; err != nil {
		t.Errorf("the late client, once a slot freed: %v", err)
	}
}

// TestOnlyTheKeyMakesRoom: on a keyed listener whose slots are all held
// by dialers from other addresses, a newcomer that has not proven the
// key in its first flight (the mark, firstflight.go) waits for a free
// slot and closes nobody's, whatever it sends and wherever it comes
// from, so that an attacker with many addresses cannot churn the slots;
// a dialer holding the key still gets a slot at once, at the cost of one
// unproven connection. Without a key, a whole hello is as good as any
// client's and makes room, but a silent newcomer still pushes nobody out.
func TestOnlyTheKeyMakesRoom(t *testing.T) {
	const slots = 4
	silent := func(t *testing.T, addr string) { silentDialer(t, acceptAt(addr), "127.0.0.20") }
	hello := func(k []byte) func(t *testing.T, addr string) {
		return func(t *testing.T, addr string) {
			go func() {
				d := vlink.Dialer{Key: k, Stack: vlink.MustParse("test-filter+tcp:local=127.0.0.20"), Timeout: 2 * time.Second}
				if c, err := d.Dial("tcp", addr); err == nil {
					c.Close()
				}
			}()
		}
	}
	for _, tc := range []struct {
		name     string
		key      []byte                          // the listener's and the client's
		newcomer func(t *testing.T, addr string) // dials from 127.0.0.20
		pushes   int                             // slots the newcomer takes
		inAll    int                             // and the client with it
	}{
		{"keyed/silent", key, silent, 0, 1},
		{"keyed/a whole hello with another key", key, hello([]byte("not the listener's key")), 0, 1},
		{"keyed/a whole hello without a key", key, hello(nil), 0, 1},
		{"unkeyed/silent", nil, silent, 0, 1},
		// The newcomer's handshake ends at once, and frees the slot it
		// took: the client takes that one.
		{"unkeyed/a whole hello", nil, hello(nil), 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, vlink.ListenConfig{
				Policy:           vlink.Policy{Key: tc.key},
				HandshakeTimeout: time.Minute,
				SniffTimeout:     -1,
				MaxHandshakes:    slots,
			})
			var held []net.Conn
			for i := range slots {
				held = append(held, silentDialer(t, l, fmt.Sprintf("127.0.0.%d", 11+i)))
			}
			time.Sleep(200 * time.Millisecond) // all four in their slots
			tc.newcomer(t, l.Addr().String())
			time.Sleep(300 * time.Millisecond) // three sweeps
			if pushed := countClosed(held, 10*time.Millisecond); pushed != tc.pushes {
				t.Fatalf("the newcomer took %d slots from their holders, want %d", pushed, tc.pushes)
			}
			d := vlink.Dialer{Key: tc.key, Stack: vlink.MustParse("test-filter+tcp:local=127.0.0.21"), Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("a client, every slot held by silent dialers: %v", err)
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 1<<10)
			if shed := countClosed(held, 100*time.Millisecond); shed != tc.inAll {
				t.Errorf("%d silent connections were shed in all, want %d", shed, tc.inAll)
			}
		})
	}
}

// countClosed counts the connections the listener closed, giving each
// d to show it (closedWithin).
func countClosed(conns []net.Conn, d time.Duration) int {
	n := 0
	for _, c := range conns {
		if closedWithin(c, d) {
			n++
		}
	}
	return n
}

// acceptAt is a net.Listener whose only use is its address.
type acceptAt string

func (a acceptAt) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (a acceptAt) Close() error              { return nil }
func (a acceptAt) Addr() net.Addr {
	ap, _ := net.ResolveTCPAddr("tcp", string(a))
	return ap
}

// TestReplayedHelloGivesWay: someone who recorded a dialer's first
// flight can replay it and pass its mark, never its challenge. Slots
// held by replays still give way to a dialer with the key: a mark is
// not a proof.
func TestReplayedHelloGivesWay(t *testing.T) {
	const slots = 4
	// Record a dialer's first flight.
	rec, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	go func() {
		d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: time.Second}
		if c, err := d.Dial("tcp", rec.Addr().String()); err == nil {
			c.Close()
		}
	}()
	rc, err := rec.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var flight []byte
	buf := make([]byte, 4096)
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(flight) < len(magic)+4 || len(flight) < len(magic)+4+int(flight[len(magic)+2])<<8|int(flight[len(magic)+3]) {
		n, err := rc.Read(buf)
		if err != nil {
			t.Fatalf("recording the first flight: %v", err)
		}
		flight = append(flight, buf[:n]...)
	}
	rc.Close()

	l := listen(t, vlink.ListenConfig{
		Policy:           vlink.Policy{Key: key},
		HandshakeTimeout: time.Minute,
		SniffTimeout:     -1,
		MaxHandshakes:    slots,
	})
	var replays []net.Conn
	for i := range slots + 2 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 11+i))}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(flight); err != nil {
			t.Fatal(err)
		}
		replays = append(replays, c)
	}
	time.Sleep(300 * time.Millisecond)
	d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter+tcp:local=127.0.0.21"), Timeout: 5 * time.Second}
	start := time.Now()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("every slot held by a replayed hello: %v", err)
	}
	defer c.Close()
	t.Logf("connected in %v", time.Since(start))
	testnet.RoundTrip(t, c, 1<<10)
}

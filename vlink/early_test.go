package vlink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/vlink-dev/vlink/filters/compress"
	_ "github.com/vlink-dev/vlink/filters/identity"
	_ "github.com/vlink-dev/vlink/filters/noise"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

var earlyKey = []byte("0123456789abcdef0123456789abcdef")

// earlyServer listens on loopback with p and the test key, as if up
// for upFor, and answers each connection's 4-byte request with "pong";
// each connection's request and whatever followed it, or the error
// reading it met, comes out of the channel.
func earlyServer(t *testing.T, p vlink.Policy, upFor time.Duration) (net.Listener, <-chan string) {
	t.Helper()
	p.Key = earlyKey
	l, err := (&vlink.ListenConfig{Policy: p}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	vlink.Backdate(l, upFor)
	got := make(chan string, 16)
	testnet.Serve(t, l, func(c net.Conn) {
		var req [4]byte
		if _, err := io.ReadFull(c, req[:]); err != nil {
			got <- fmt.Sprintf("error: %v", err)
			return
		}
		c.Write([]byte("pong"))
		rest, err := io.ReadAll(c)
		if err != nil {
			got <- fmt.Sprintf("%s%s, then error: %v", req[:], rest, err)
			return
		}
		got <- string(req[:]) + string(rest)
	})
	return l, got
}

// pingEarly dials address with DialEarly, its early data "ping" (or
// writes it after, if DialEarly did not ask), reads the answer, calls
// answered (if set) and closes; it reports whether DialEarly asked for
// the data.
func pingEarly(t *testing.T, d *vlink.Dialer, address string, answered func()) (asked bool) {
	t.Helper()
	c, err := d.DialEarly(context.Background(), "tcp", address, func() []byte {
		asked = true
		return []byte("ping")
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second)) // a lost request fails, not hangs
	if !asked {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
	}
	var ans [4]byte
	if _, err := io.ReadFull(c, ans[:]); err != nil || string(ans[:]) != "pong" {
		t.Fatalf("answer %q, %v; want pong", ans, err)
	}
	if answered != nil {
		answered()
	}
	if err := c.(netconn.CloseWriter).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	return asked
}

// TestDialEarly counts the flights of connections to the first byte of
// their answers when the caller has its request at dial time: with a
// listener that takes early data, the request rides the first flight and
// the answer comes back in the second, two where the first flight alone
// takes four. The request reaches the listener's side once, whether it
// took the early data or dropped it and the dialer sent it again.
func TestDialEarly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		identity bool
		refuse   bool
		upFor    time.Duration
		asked    []bool // did DialEarly ask for the data, dial by dial
		flights  []int
	}{
		// The first contact goes the long way and learns the
		// listener's key and that it takes early data.
		{"takes early data", true, false, time.Minute, []bool{false, true, true}, []int{8, 2, 2}},
		// Up for less than the replay window: it drops the data,
		// which go again after the handshake.
		{"just started", true, false, 0, []bool{false, true, true}, []int{8, 4, 4}},
		{"refuses early data", true, true, time.Minute, []bool{false, false, false}, []int{8, 4, 4}},
		{"no identity", false, false, time.Minute, []bool{false, false}, []int{4, 4}},
	} {
		for _, stack := range []string{"noise", "zstd+noise", "identity+noise"} {
			t.Run(tc.name+"/"+stack, func(t *testing.T) {
				p := vlink.Policy{RefuseEarlyData: tc.refuse}
				if tc.identity {
					p.Identity = vlink.NewIdentity()
				}
				l, got := earlyServer(t, p, tc.upFor)
				fr := testnet.NewFlightRecorder(t, l.Addr().String())
				d := &vlink.Dialer{Stack: vlink.MustParse(stack), Key: earlyKey}
				t.Cleanup(func() { d.Close() })
				for i := range tc.flights {
					var fl []testnet.Flight
					asked := pingEarly(t, d, fr.Addr, func() { fl = fr.Flights(i) })
					if req := <-got; req != "ping" {
						t.Fatalf("dial %d: the listener's side read %q, want ping", i, req)
					}
					if asked != tc.asked[i] || len(fl) != tc.flights[i] || !fl[0].Up {
						t.Errorf("dial %d: asked for early data %v, %d flights to the answer; want %v, %d", i, asked, len(fl), tc.asked[i], tc.flights[i])
						for j, f := range fl {
							t.Logf("flight %d: up %v, %d bytes", j, f.Up, len(f.Bytes))
						}
					}
				}
			})
		}
	}
}

// TestEarlyDataReplayed sends a recorded first flight that carried early
// data again: to its listener, which answers the long way; to the same
// listener restarted (its identity, its key, a new process), which takes
// the flight but not its data, so the request does not reach the target
// a second time; and to another listener of the key, with another
// identity, which answers the long way. A listener with the same identity
// that has been up for a while takes it, data and all: why each listener
// needs an identity of its own (Policy.Identity).
func TestEarlyDataReplayed(t *testing.T) {
	id := vlink.NewIdentity()
	l, got := earlyServer(t, vlink.Policy{Identity: id}, time.Minute)
	fr := testnet.NewFlightRecorder(t, l.Addr().String())
	d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Key: earlyKey}
	t.Cleanup(func() { d.Close() })
	pingEarly(t, d, fr.Addr, nil) // learns the key
	if !pingEarly(t, d, fr.Addr, nil) {
		t.Fatal("the second dial carried no early data")
	}
	for range 2 {
		if req := <-got; req != "ping" {
			t.Fatalf("the listener's side read %q, want ping", req)
		}
	}
	first := fr.Flights(1)[0].Bytes

	restarted, gotRestarted := earlyServer(t, vlink.Policy{Identity: id}, 0)
	other, gotOther := earlyServer(t, vlink.Policy{Identity: vlink.NewIdentity()}, time.Minute)
	twin, gotTwin := earlyServer(t, vlink.Policy{Identity: id}, time.Minute)
	for _, tc := range []struct {
		name string
		l    net.Listener
		got  <-chan string
		want string // the answer's message type; what the listener's side reads
		read string
	}{
		{"the same listener", l, got, "challenge", ""},
		{"restarted", restarted, gotRestarted, "accept", "error"},
		{"another identity", other, gotOther, "challenge", ""},
		{"the same identity, up for a minute", twin, gotTwin, "accept", "ping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Dial("tcp", tc.l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Write(first); err != nil {
				t.Fatal(err)
			}
			var h [4]byte // version, type, length of the listener's answer
			if _, err := io.ReadFull(raw, h[:]); err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			if typ := map[byte]string{2: "challenge", 4: "accept"}[h[1]]; typ != tc.want {
				t.Fatalf("the listener answered with message type %d, want a %s", h[1], tc.want)
			}
			// What the listener's side reads while the replay's
			// connection stays open, then once it is closed.
			var read string
			select {
			case read = <-tc.got:
			case <-time.After(300 * time.Millisecond):
				raw.Close()
				select {
				case read = <-tc.got:
				case <-time.After(300 * time.Millisecond):
				}
			}
			raw.Close()
			if len(read) > len(tc.read) {
				read = read[:len(tc.read)]
			}
			if read != tc.read {
				t.Fatalf("the listener's side read %q, want %q", read, tc.read)
			}
		})
	}
}

// TestDialEarlyEdges: early data larger than a first message holds goes
// after the handshake, whole; a refusal is DialEarly's error, as
// DialContext's.
func TestDialEarlyEdges(t *testing.T) {
	var admits atomic.Int32
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: earlyKey, Identity: vlink.NewIdentity()}, Admit: func(context.Context, *vlink.Hello) (any, error) {
		if admits.Add(1) == 3 {
			return nil, &vlink.RefusedError{Code: vlink.CodeUnreachable, Reason: "no route to the target"}
		}
		return nil, nil
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	vlink.Backdate(l, time.Minute)
	testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
	d := &vlink.Dialer{Stack: vlink.MustParse("zstd+noise"), Key: earlyKey}
	t.Cleanup(func() { d.Close() })
	pingEcho := func(early []byte) (net.Conn, bool, error) {
		asked := false
		c, err := d.DialEarly(context.Background(), "tcp", l.Addr().String(), func() []byte { asked = true; return early })
		return c, asked, err
	}

	c, _, err := pingEcho(nil) // learns the key
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	big := testnet.RandomBytes(200<<10, 1)
	c, asked, err := pingEcho(big)
	if err != nil || !asked {
		t.Fatalf("dial: asked %v, %v", asked, err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	back := make([]byte, len(big))
	if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, big) {
		t.Fatalf("echoed %v, intact %v; want the %d bytes written early", err, bytes.Equal(back, big), len(big))
	}
	c.Close()

	_, asked, err = pingEcho([]byte("ping"))
	var re *vlink.RefusedError
	if !asked || !errors.As(err, &re) || re.Code != vlink.CodeUnreachable || !errors.Is(err, vlink.ErrRefused) {
		t.Fatalf("dial refused by the listener: asked %v, %v; want a *vlink.RefusedError, unreachable", asked, err)
	}
}

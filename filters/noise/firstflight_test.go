package noise_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// countingListener listens on loopback with p and counts the
// connections it admits.
func countingListener(t *testing.T, p vlink.Policy) (net.Listener, *atomic.Int32) {
	t.Helper()
	admits := new(atomic.Int32)
	lc := vlink.ListenConfig{Policy: p, Admit: func(context.Context, *vlink.Hello) (any, error) {
		admits.Add(1)
		return nil, nil
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, admits
}

// TestFirstFlightRoundTrips counts the flights of keyed, encrypted
// connections to the first byte of their answers: the hello and the
// noise layer's first message go together, and the listener answers both
// at once, so the request goes in the third flight and its answer comes
// in the fourth, where the long way takes eight (hello, challenge,
// proof, accept, the layer's two messages, request, answer).
func TestFirstFlightRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		name     string
		identity bool
		pinned   string // what Dialer.PinnedKey gives: "", "its key", "another key"
		flights  []int  // of each dial in turn, through one Dialer
	}{
		{"no identity", false, "", []int{4, 4}},
		// The dialer knows no key at the first contact: the listener
		// answers the long way, and its accept says its key, which the
		// next first flight names (NKpsk0).
		{"an identity", true, "", []int{8, 4, 4}},
		// Unless the key was pinned before (by another process).
		{"an identity pinned before", true, "its key", []int{4, 4}},
		{"another key pinned", true, "another key", []int{8, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := vlink.Policy{Key: key}
			if tc.identity {
				p.Identity = vlink.NewIdentity()
			}
			var pin []byte
			switch tc.pinned {
			case "its key":
				pin, _ = vlink.IdentityPublic(p.Identity)
			case "another key":
				pin, _ = vlink.IdentityPublic(vlink.NewIdentity())
			}
			l, admits := countingListener(t, p)
			testnet.Serve(t, l, func(c net.Conn) {
				var req [4]byte
				if _, err := io.ReadFull(c, req[:]); err == nil && string(req[:]) == "ping" {
					c.Write([]byte("pong"))
				}
			})
			// One address for every dial: what the Dialer remembers is
			// per listener address.
			fr := testnet.NewFlightRecorder(t, l.Addr().String())
			d := &vlink.Dialer{Stack: vlink.MustParse("zstd+noise"), Key: key}
			if pin != nil {
				d.PinnedKey = func(string) []byte { return pin }
			}
			t.Cleanup(func() { d.Close() })
			for i, want := range tc.flights {
				c, err := d.Dial("tcp", fr.Addr)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				var ans [4]byte
				if _, err := io.ReadFull(c, ans[:]); err != nil || string(ans[:]) != "pong" {
					t.Fatalf("dial %d: answer %q, %v; want pong", i, ans, err)
				}
				fl := fr.Flights(i)
				c.Close()
				if len(fl) != want || !fl[0].Up {
					t.Errorf("dial %d: %d flights to the answer; want %d", i, len(fl), want)
					for j, f := range fl {
						t.Logf("flight %d: up %v, %d bytes", j, f.Up, len(f.Bytes))
					}
				}
			}
			if n, want := admits.Load(), int32(len(tc.flights)); n != want {
				t.Errorf("admitted %d times, want %d", n, want)
			}
		})
	}
}

// TestFirstFlightReplayed sends a recorded first flight (a hello with
// its mark and the layer's first message) to the listener again: it
// answers the long way, with a challenge the replay cannot meet, and
// admits nothing more.
func TestFirstFlightReplayed(t *testing.T) {
	l, admits := countingListener(t, vlink.Policy{Key: key})
	testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
	fr := testnet.NewFlightRecorder(t, l.Addr().String())
	d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Key: key}
	t.Cleanup(func() { d.Close() })
	c, err := d.Dial("tcp", fr.Addr)
	if err != nil {
		t.Fatal(err)
	}
	echoString(t, c, "first")
	c.Close()
	first := fr.Flights(0)[0]
	if !first.Up {
		t.Fatal("the listener spoke first")
	}

	for _, name := range []string{"replayed", "replayed again"} {
		raw, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Write(first.Bytes); err != nil {
			t.Fatal(err)
		}
		var h [4]byte // version, type, length of the listener's answer
		if _, err := io.ReadFull(raw, h[:]); err != nil {
			t.Fatalf("%s: reading the answer: %v", name, err)
		}
		if h[1] != 2 {
			t.Fatalf("%s: the listener answered with message type %d, want a challenge (2)", name, h[1])
		}
		raw.Close()
	}
	// A fresh dial still goes the short way.
	c, err = d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	echoString(t, c, "second")
	c.Close()
	if n := admits.Load(); n != 2 {
		t.Errorf("admitted %d times, want 2 (the two dials, no replay)", n)
	}
}

// TestFirstFlightChanged changes the first field of a hello on the way
// (the cipher it names, its time): the mark no longer matches, the
// listener answers the long way, and the dialer's proof, made over the
// hello it sent, fails there: the dial is refused for the key.
func TestFirstFlightChanged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(v []byte) // the field's value
	}{
		{"time", func(v []byte) { v[7] ^= 1 }},
		{"cipher", func(v []byte) { v[8] = 3 - max(v[8], 1) }}, // another known one
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, d := keyedPair(t, "noise", nil)
			testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
			_, err := d.Dial("tcp", rewriteHello(t, l.Addr().String(), func(tag byte, v []byte) {
				if tag == 20 {
					tc.change(v)
				}
			}))
			if !errors.Is(err, vlink.ErrAuth) {
				t.Fatalf("dial: %v, want vlink.ErrAuth", err)
			}
		})
	}
}

// rewriteHello relays one connection to target, passing each field of
// the dialer's hello through change first.
func rewriteHello(t *testing.T, target string, change func(tag byte, v []byte)) string {
	return relayOnce(t, target, func(c, u net.Conn) {
		var head [8 + 4]byte // the magic, the frame's header
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint16(head[10:]))
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		for f := body; len(f) >= 3; {
			n := min(int(binary.BigEndian.Uint16(f[1:])), len(f)-3)
			change(f[0], f[3:3+n])
			f = f[3+n:]
		}
		u.Write(append(head[:], body...))
		go io.Copy(u, c)
		io.Copy(c, u)
	})
}

// echoString sends s through an echoing c and reads it back.
func echoString(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(s))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != s {
		t.Fatalf("echo %q, %v; want %q", got, err, s)
	}
}

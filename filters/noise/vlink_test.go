package noise_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/filters/noise"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

var key = []byte("a pre-shared key of 32 bytes....")

// TestThroughVLink runs noise in vlink stacks, checks what each side must
// configure, and that the plaintext never crosses the wire.
func TestThroughVLink(t *testing.T) {
	secret := bytes.Repeat([]byte("top secret payload "), 1000)
	tests := []struct {
		name               string
		stack              string
		dialKey, listenKey []byte
		is                 error
		mention            string // in the error, for a person
	}{
		{"noise", "noise", key, key, nil, ""},
		{"zstd above noise", "zstd+noise", key, key, nil, ""},
		{"noise above mux", "noise+mux", key, key, nil, ""},
		{"noise below parallel", "parallel:streams=2+noise", key, key, nil, ""},
		{"no key to dial", "noise", nil, key, vlink.ErrKeyRequired, "--key-file"},
		{"listener without key", "noise", key, nil, vlink.ErrNotAllowed, "--key-file"},
		{"other key", "noise", key, []byte("another key of enough bytes"), vlink.ErrAuth, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lc := vlink.ListenConfig{Policy: vlink.Policy{Key: tt.listenKey}}
			l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			done := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				got, err := io.ReadAll(c)
				if err == nil && !bytes.Equal(got, secret) {
					err = errors.New("the listener read other bytes than were sent")
				}
				done <- err
			}()
			tp := testnet.NewFlightRecorder(t, l.Addr().String())
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Key: tt.dialKey}
			defer d.Close()
			c, err := d.Dial("tcp", tp.Addr)
			if tt.is != nil {
				if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.mention) {
					t.Fatalf("dial: %v, want %v mentioning %q", err, tt.is, tt.mention)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(secret); err != nil {
				t.Fatal(err)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			c.Close()
			if bytes.Contains(tp.All(), []byte("top secret")) {
				t.Fatal("plaintext crossed the wire")
			}
		})
	}
}

// TestCipherNegotiated checks the cipher a stack ends up with:
// AES-256-GCM where this machine has the instructions, unless the dialer
// says aes=false, which offers nothing (ChaCha20-Poly1305, the layer's
// first); the listener's choice is what both ends' records use (bytes
// cross intact).
func TestCipherNegotiated(t *testing.T) {
	best := layer.AEADDefault // nothing offered without AES instructions
	if slices.Contains(layer.LocalAEADs(), layer.AEADAESGCM) {
		best = layer.AEADAESGCM
	}
	tests := []struct {
		stack string
		want  layer.AEAD
	}{
		{"noise", best},
		{"zstd+noise", best},
		{"noise:aes=false", layer.AEADDefault},
	}
	for _, tt := range tests {
		t.Run(tt.stack, func(t *testing.T) {
			l, d := keyedPair(t, tt.stack, nil)
			got := make(chan *vlink.Hello, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					got <- nil
					return
				}
				defer c.Close()
				io.Copy(c, c)
				got <- c.(*vlink.Conn).Hello()
			}()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			echo(t, c)
			h := <-got
			if h == nil || h.AEAD != tt.want {
				t.Fatalf("listener's hello agreed on %v, want %v", h.AEAD, tt.want)
			}
		})
	}
}

// TestCipherDowngradeFails checks that no one on the way can change the
// cipher the listener chose: a relay that rewrites the accept's choice
// to the other cipher the hello offered makes the handshake fail (the
// accept is in the transcript the handshake binds to): the listener with
// ErrAuth, the dialer with the listener's close. The same relay without
// the rewrite carries the connection. The listener has an identity the
// dialer has not pinned, so it answers the long way, with an accept
// that chooses (a first flight's hello names the cipher itself:
// TestFirstFlightChanged).
func TestCipherDowngradeFails(t *testing.T) {
	if len(layer.LocalAEADs()) < 2 {
		t.Skip("this CPU has no AES instructions: the hello offers one cipher, there is nothing to downgrade")
	}
	for _, rewrite := range []bool{false, true} {
		t.Run(fmt.Sprintf("rewrite=%v", rewrite), func(t *testing.T) {
			accepted := make(chan error, 1)
			lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Identity: vlink.NewIdentity()}, Observe: func(c *vlink.Conn, _ time.Duration, err error) {
				if err == nil {
					_, err = c.Write([]byte("x"))
					c.Close()
				}
				accepted <- err
			}}
			l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Key: key}
			t.Cleanup(func() { d.Close() })
			c, err := d.Dial("tcp", relayAccept(t, l.Addr().String(), rewrite))
			if err == nil {
				_, err = io.ReadFull(c, make([]byte, 1))
				c.Close()
			}
			lerr := <-accepted
			if !rewrite {
				if err != nil || lerr != nil {
					t.Fatalf("dialer: %v, listener: %v; want both to succeed", err, lerr)
				}
				return
			}
			if !errors.Is(lerr, noise.ErrAuth) {
				t.Fatalf("listener: %v, want noise.ErrAuth", lerr)
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("dialer: %v, want io.ErrUnexpectedEOF", err)
			}
		})
	}
}

// relayOnce relays one connection to target through relay, which gets
// the dialer's side c and the target's u, and returns the address to
// dial. Both close when relay returns.
func relayOnce(t *testing.T, target string, relay func(c, u net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		u, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer u.Close()
		relay(c, u)
	}()
	return ln.Addr().String()
}

// keyedPair returns a listener on loopback, told of each handshake's end
// by observe if set, and a dialer of stack, both holding key.
func keyedPair(t *testing.T, stack string, observe func(*vlink.Conn, time.Duration, error)) (net.Listener, *vlink.Dialer) {
	t.Helper()
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key}, Observe: observe}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	d := &vlink.Dialer{Stack: vlink.MustParse(stack), Key: key}
	t.Cleanup(func() { d.Close() })
	return l, d
}

// echo sends 1 MiB through an echoing c and checks it comes back whole.
func echo(t *testing.T, c net.Conn) {
	t.Helper()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	go func() {
		c.Write(data)
		c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	back, err := io.ReadAll(c)
	c.Close()
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("echoed %d of %d bytes intact, err %v", len(back), len(data), err)
	}
}

// relayAccept relays one connection to target and, if rewrite is set,
// changes the cipher the listener's accept chooses (the hello's field 18)
// to the other one offered.
func relayAccept(t *testing.T, target string, rewrite bool) string {
	return relayOnce(t, target, func(c, u net.Conn) {
		go io.Copy(u, c)
		// Frames from the listener: version, type, length, then fields
		// of tag, length, value. The challenge, then the accept.
		for {
			var h [4]byte
			if _, err := io.ReadFull(u, h[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint16(h[2:]))
			if _, err := io.ReadFull(u, body); err != nil {
				return
			}
			accept := h[1] == 4
			for f := body; rewrite && accept && len(f) >= 3; {
				n := int(binary.BigEndian.Uint16(f[1:]))
				if f[0] == 18 && n == 1 {
					f[3] = 3 - f[3] // AES-256-GCM (2) <-> ChaCha20-Poly1305 (1)
				}
				f = f[min(len(f), 3+n):]
			}
			c.Write(append(h[:], body...))
			if accept {
				io.Copy(c, u)
				return
			}
		}
	})
}

package noise_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/filters/noise"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/knownnodes"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// identityListener listens on addr (":0" style for any port) with the key
// and identity, and echoes what each connection sends.
func identityListener(t *testing.T, addr string, identity []byte) *vlink.Listener {
	t.Helper()
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Identity: identity}}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { io.Copy(c, c) })
	return l
}

// echoDial dials addr through noise with the pins of f and checks the
// echo.
func echoDial(t *testing.T, addr string, peerKey vlink.PeerKeyCallback) error {
	t.Helper()
	d := pinningDialer(peerKey)
	defer d.Close()
	return echoDialWith(t, d, addr)
}

// pinningDialer dials through noise with the pins of peerKey.
func pinningDialer(peerKey vlink.PeerKeyCallback) *vlink.Dialer {
	return &vlink.Dialer{Stack: vlink.MustParse("zstd+noise"), Key: key, PeerKey: peerKey}
}

// echoDialWith is echoDial through d, which may remember the key a
// listener proved (its next first flight names it).
func echoDialWith(t *testing.T, d *vlink.Dialer, addr string) error {
	t.Helper()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	msg := []byte("through the pinned node")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}
	return nil
}

// TestIdentityPinned: a dialer pins the identity of a listener on first
// use, passes it afterwards, and refuses, naming both fingerprints and the
// pinning line, a listener at the same address with another identity or
// with none (a downgrade); a dialer that pins nothing still reaches it.
func TestIdentityPinned(t *testing.T) {
	id1, id2 := vlink.NewIdentity(), vlink.NewIdentity()
	pub1, _ := vlink.IdentityPublic(id1)
	pub2, _ := vlink.IdentityPublic(id2)
	path := filepath.Join(t.TempDir(), "vlink", "known_nodes")
	f := knownnodes.New(path)
	var pinned []string
	f.Pinned = func(address string, key []byte) { pinned = append(pinned, address+" "+knownnodes.Fingerprint(key)) }

	l := identityListener(t, "127.0.0.1:0", id1)
	addr := l.Addr().String()
	// One dialer throughout: its second dial names the key the first
	// pinned (a first flight), and so do its dials to the listeners
	// below, which answer the long way.
	d := pinningDialer(f.Check)
	defer d.Close()
	for i := range 2 {
		if err := echoDialWith(t, d, addr); err != nil {
			t.Fatalf("dial %d: %v", i+1, err)
		}
	}
	if want := addr + " " + knownnodes.Fingerprint(pub1); len(pinned) != 1 || pinned[0] != want {
		t.Fatalf("pinned %q, want once %q", pinned, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the pin file: %v, %v; want mode 600", fi, err)
	}
	l.Close()

	for _, tc := range []struct {
		name      string
		identity  []byte
		presented string
	}{
		{"another identity", id2, knownnodes.Fingerprint(pub2)},
		{"no identity", nil, "announced no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := identityListener(t, addr, tc.identity)
			defer l.Close()
			err := echoDialWith(t, d, addr)
			var kc *knownnodes.KeyChangedError
			if !errors.Is(err, knownnodes.ErrKeyChanged) || !errors.As(err, &kc) {
				t.Fatalf("dial: %v, want a KeyChangedError", err)
			}
			for _, s := range []string{tc.presented, knownnodes.Fingerprint(pub1), path + ":1", "delete that line"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not mention %q", err, s)
				}
			}
			if err := echoDial(t, addr, nil); err != nil {
				t.Errorf("a dialer that pins nothing: %v", err)
			}
		})
	}
}

// TestIdentityProven: the listener proves it holds the private half of
// the key its accept announced. A dialer handed another public key (as
// if someone holding the pre-shared key had swapped the accept's) fails
// the handshake, whichever key it expected.
func TestIdentityProven(t *testing.T) {
	id, other := vlink.NewIdentity(), vlink.NewIdentity()
	pub, _ := vlink.IdentityPublic(id)
	otherPub, _ := vlink.IdentityPublic(other)
	for _, tc := range []struct {
		name    string
		peerKey []byte
		ok      bool
	}{
		{"the right key", pub, true},
		{"another key", otherPub, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			errs := make(chan error, 1)
			go func() {
				_, err := noise.Filter{}.ServerHandshake(b, layer.Handshake{Key: key, Transcript: []byte("t"), Static: layer.KeyPair{Private: id, Public: pub}})
				if err != nil {
					b.Close()
				}
				errs <- err
			}()
			_, err := noise.Filter{}.ClientHandshake(a, layer.Handshake{Key: key, Transcript: []byte("t"), PeerStatic: tc.peerKey})
			if tc.ok && err != nil {
				t.Fatalf("client: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("the handshake completed against a key the listener does not hold")
			}
			a.Close()
			if serr := <-errs; tc.ok && serr != nil {
				t.Fatalf("server: %v", serr)
			}
		})
	}
}

// TestIdentityAboveMultiLink: with noise above a multi-link layer
// (noise+mux, noise+parallel) the first encrypted segment proves the
// listener's identity, as noise at the bottom does: the dialer's check
// sees the listener's key, and refuses another.
func TestIdentityAboveMultiLink(t *testing.T) {
	id := vlink.NewIdentity()
	pub, _ := vlink.IdentityPublic(id)
	errOther := errors.New("not the pinned key")
	for _, where := range []string{"127.0.0.1", hostAddr(t).String()} {
		l := identityListener(t, net.JoinHostPort(where, "0"), id)
		for _, stack := range []string{"noise+mux", "zstd+noise+parallel:streams=2", "mux+noise"} {
			for _, pin := range []struct {
				name string
				key  []byte
			}{{"pinned", pub}, {"another pinned", make([]byte, len(pub))}} {
				t.Run(where+"/"+stack+"/"+pin.name, func(t *testing.T) {
					var seen [][]byte
					check := func(_ string, k []byte) error {
						seen = append(seen, k)
						if !bytes.Equal(k, pin.key) {
							return errOther
						}
						return nil
					}
					d := &vlink.Dialer{Stack: vlink.MustParse(stack), Key: key, PeerKey: check}
					defer d.Close()
					c, err := d.Dial("tcp", l.Addr().String())
					if err == nil {
						err = testnet.Echoed(c, 1000)
						c.Close()
					}
					if len(seen) == 0 || !bytes.Equal(seen[0], pub) {
						t.Errorf("the dialer's check saw %x, want the listener's key %x", seen, pub)
					}
					if wantOK := bytes.Equal(pin.key, pub); wantOK != (err == nil) || !wantOK && !errors.Is(err, errOther) {
						t.Errorf("dial and echo: %v, want success %v", err, wantOK)
					}
				})
			}
		}
	}
}

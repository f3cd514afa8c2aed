package vlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	_ "github.com/vlink-dev/vlink/filters/mux"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Test-only layers with wire versions: a filter whose two sides agree on
// the version they were built with, or fail, as two formats would.
func init() {
	for _, s := range []struct {
		name                  string
		oldest, newest, speak int
	}{
		{"test-wire", 2, 3, 3},      // dropped version 1, speaks 3 by default
		{"test-wire-base", 1, 2, 2}, // speaks 2 by default, still 1
	} {
		layer.Register(layer.Spec{
			Name: s.name, Kind: layer.KindFilter, Summary: "sends its wire version first; the listener's side checks it",
			Params: []layer.Param{layer.Version(s.oldest, s.newest, s.speak)},
			New: func(a layer.Args) (any, error) {
				v, err := a.Version()
				return wireFilter{v}, err
			},
		})
	}
}

type wireFilter struct{ version int }

func (f wireFilter) Client(c net.Conn) (net.Conn, error) {
	_, err := c.Write([]byte{byte(f.version)})
	return c, err
}

func (f wireFilter) Server(c net.Conn) (net.Conn, error) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return nil, err
	}
	if int(b[0]) != f.version {
		return nil, fmt.Errorf("the dialer's side speaks wire version %d, this side %d: the stream would be garbled", b[0], f.version)
	}
	return c, nil
}

// echoListener is a listener with the zero Policy that echoes what it
// accepts and reports each connection's hello.
func echoListener(t *testing.T) (*Listener, <-chan *Hello) {
	t.Helper()
	var lc ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hellos := make(chan *Hello, 10)
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.AcceptVLink()
			if err != nil {
				return
			}
			hellos <- c.Hello()
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l, hellos
}

// TestWireVersionRefused: a hello that asks for a wire version the
// listener's layer does not speak is refused before any of the layer's
// bytes cross, with CodeVersion and a reason that names both versions and
// the side to upgrade (the older one), as the error the dialer's Dial
// returns. The hellos are those of builds older or newer than this one,
// as this build's dialer code sends them.
func TestWireVersionRefused(t *testing.T) {
	l, _ := echoListener(t)
	for _, tc := range []struct {
		hello string // the stack field of the hello
		want  string // the refusal's reason; "" for an accept
	}{
		{"test-wire", "layer 1 (test-wire): the dialer speaks wire version 1 (its hello names none), this listener versions 2 to 3: upgrade the dialer"},
		{"test-wire:version=4", "layer 1 (test-wire): the dialer speaks wire version 4, this listener versions 2 to 3: upgrade the listener"},
		{"test-wire:version=2", ""},
		{"mux:version=2", "layer 1 (mux): the dialer speaks wire version 2, this listener version 1: upgrade the listener"},
		{"mux:version=0", "layer 1 (mux): the dialer speaks wire version 0, this listener version 1: upgrade the dialer"},
		{"mux", ""},
		{"mux:version=1", ""},
		// A layer without versions speaks version 1: this build refuses
		// the hello of a later one that gives it a version 2.
		{"test-xor:version=2", "layer 1 (test-xor): the dialer speaks wire version 2, this listener version 1: upgrade the listener"},
		{"test-xor:version=1", ""},
	} {
		t.Run(tc.hello, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d := &helloDialer{next: &net.Dialer{}, peer: l.Addr().String(), stack: tc.hello}
			c, err := d.DialContext(ctx, "tcp", l.Addr().String())
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("accepted")
			}
			var re *RefusedError
			var oe *net.OpError
			switch {
			case !errors.As(err, &oe) || !errors.As(err, &re):
				t.Fatalf("%v (%T): want a *RefusedError in a *net.OpError", err, err)
			case re.Code != CodeVersion || !errors.Is(err, ErrRefused):
				t.Fatalf("%v: code %d, want CodeVersion (%d), matching ErrRefused", err, re.Code, CodeVersion)
			case re.Reason != tc.want:
				t.Fatalf("reason %q\nwant   %q", re.Reason, tc.want)
			}
		})
	}
}

// TestWireVersionAgreed: whatever a dialer's stack says of a layer's
// version, or leaves to its default, both sides build the layer with the
// same version (the test layers fail the connection otherwise), and the
// hello names it only when it is not version 1, so that a listener from
// before the layer had versions understands a hello of version 1.
func TestWireVersionAgreed(t *testing.T) {
	l, hellos := echoListener(t)
	for _, tc := range []struct {
		stack string // the dialer's
		hello string // the hello's stack field
		built string // the listener's Hello.Stack: what it built
	}{
		{"test-wire", "test-wire:version=3", "test-wire:version=3"},
		{"test-wire:version=2", "test-wire:version=2", "test-wire:version=2"},
		{"test-wire-base", "test-wire-base:version=2", "test-wire-base:version=2"},
		// Version 1 goes unnamed, and the listener, whose default is 2,
		// takes the unnamed version for 1.
		{"test-wire-base:version=1", "test-wire-base", "test-wire-base:version=1"},
		{"test-wire-base:version=2+test-wire", "test-wire-base:version=2+test-wire:version=3", "test-wire-base:version=2+test-wire:version=3"},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			stack := MustParse(tc.stack)
			if got := helloStack(stack.mirrored()); got != tc.hello {
				t.Errorf("hello names %q, want %q", got, tc.hello)
			}
			d := &Dialer{Stack: stack}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			msg := []byte("same version both sides")
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
				t.Fatalf("echo: %q, %v", got, err)
			}
			if h := <-hellos; h.Stack.String() != tc.built {
				t.Errorf("the listener built %q, want %q", h.Stack, tc.built)
			}
		})
	}
}

// builtVersion is the wire version a layer is built with, as layer.Args
// reads it: the one its parameters name, else the schema's default, and
// version 1 for a layer without versions.
func builtVersion(t *testing.T, l Layer) int64 {
	v, ok := l.Params[layer.VersionParam]
	if !ok {
		v = "1"
		if p, versioned := lookup(l.Name).Param(layer.VersionParam); versioned {
			v = p.Default
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("layer %s: version %q", l.Name, v)
	}
	return n
}

// FuzzWireVersion: for any stack a dialer parses, each hello it sends
// asks for exactly the wire version it builds each layer with (naming it
// unless it is version 1), so that any listener, whatever its defaults,
// reads the version the dialer speaks; and this build's listener either
// refuses that hello or builds every layer with that same version.
func FuzzWireVersion(f *testing.F) {
	for _, s := range []string{"test-wire", "test-wire-base:version=1+test-xor", "test-xor+test-wire:version=2+test-wire-base",
		"mux", "mux:version=1+test-wire", "test-wire-base+mux+test-xor:key=3", "test-filter:level=2", "test-wire-base:version=01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := Parse(text)
		if err != nil {
			return
		}
		for _, seg := range segments(s.mirrored()) {
			hello := helloStack(seg)
			asked, err := Parse(hello)
			if err != nil {
				t.Fatalf("%q: its hello %q does not parse: %v", text, hello, err)
			}
			for i, l := range seg {
				_, named := asked.Layers[i].Params[layer.VersionParam]
				v := int64(1)
				if named {
					v = builtVersion(t, asked.Layers[i])
				}
				if want := builtVersion(t, l); v != want || named && v == 1 {
					t.Fatalf("%q: the hello %q asks layer %d for version %d (named %v), the dialer builds %d", text, hello, i+1, v, named, want)
				}
			}
			var p Policy
			got, rerr := p.checkStack(hello, false)
			if rerr != nil {
				continue
			}
			for i, l := range seg {
				if a, b := builtVersion(t, l), builtVersion(t, got.Layers[i]); a != b {
					t.Fatalf("%q: the dialer builds layer %d with version %d, the listener with %d", text, i+1, a, b)
				}
			}
		}
	})
}

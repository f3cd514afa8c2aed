package quic_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/quic"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

var testKey = []byte("a pre-shared key of 16+ bytes, for tests")

// echoListener is a keyed vlink listener on QUIC that echoes each
// connection; it returns its address.
func echoListener(t *testing.T, key []byte) string {
	t.Helper()
	inner, err := vlink.ListenStack(context.Background(), vlink.MustParse("quic"), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&vlink.ListenConfig{Policy: vlink.Policy{Key: key}}).NewListener(inner)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, testnet.Echo)
	return inner.Addr().String()
}

// mitm takes QUIC streams with a certificate of its own and relays each
// to target on a QUIC connection of its own: what someone between a
// dialer and a listener could do, since neither checks the other's
// certificate without a pin.
func mitm(t *testing.T, target string) string {
	t.Helper()
	l, err := vlink.ListenStack(context.Background(), vlink.MustParse("quic"), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &vlink.Dialer{Stack: vlink.MustParse("quic")}
	testnet.Serve(t, l, func(c net.Conn) {
		up, err := d.Dial("tcp", target)
		if err == nil {
			netconn.Relay(c, up)
		}
	})
	// Before Serve's cleanup waits for the relays: closing the dialer's
	// QUIC connections ends them, whatever the test left open.
	t.Cleanup(func() { d.Close() })
	return l.Addr().String()
}

func echoOnce(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
}

// TestHelloBinding: the hello's proofs cover the QUIC connection's
// channel binding, so a keyed dial works straight to the listener and
// fails through a man in the middle.
func TestHelloBinding(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	for _, stack := range []string{"identity+quic", "lz4+mux+quic"} {
		t.Run(stack, func(t *testing.T) {
			srv := echoListener(t, testKey)
			d := &vlink.Dialer{Stack: vlink.MustParse(stack), Key: testKey}
			defer d.Close()
			c, err := d.Dial("tcp", srv)
			if err != nil {
				t.Fatalf("direct: %v", err)
			}
			echoOnce(t, c)
			c.Close()

			c, err = d.Dial("tcp", mitm(t, srv))
			if err == nil {
				c.Close()
				t.Fatal("a keyed dial through a man in the middle succeeded: the hello's proofs are not bound to the QUIC connection")
			}
			if !errors.Is(err, vlink.ErrAuth) {
				t.Fatalf("through a man in the middle: %v, want vlink.ErrAuth", err)
			}
		})
	}
}

// TestEncryptionRule: beyond loopback, a keyed stack over quic runs
// without the noise layer (QUIC's TLS encrypts, the bound proofs
// authenticate) and the keyed listener takes it; over tcp the dialer
// adds noise. A dialer that pins the listener's identity still adds
// noise, which is what proves it.
func TestEncryptionRule(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	host := testenv.NonLoopbackIPv4(t).String()
	for _, tc := range []struct {
		factory string
		pinned  bool
		want    string
	}{
		{"quic", false, "identity"},
		{"tcp", false, "identity+noise"},
		{"quic", true, "identity+noise"},
	} {
		t.Run(tc.factory, func(t *testing.T) {
			inner, err := vlink.ListenStack(context.Background(), vlink.MustParse(tc.factory), "tcp", net.JoinHostPort(host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			l, err := (&vlink.ListenConfig{Policy: vlink.Policy{Key: testKey}}).NewListener(inner)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			acc := make(chan *vlink.Conn, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					acc <- nil
					return
				}
				acc <- c.(*vlink.Conn)
			}()
			d := &vlink.Dialer{Stack: vlink.MustParse("identity+" + tc.factory), Key: testKey}
			if tc.pinned {
				d.PeerKey = func(string, []byte) error { return nil }
			}
			defer d.Close()
			c, err := d.Dial("tcp", inner.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sc := <-acc
			if sc == nil {
				t.Fatal("the listener took nothing")
			}
			defer sc.Close()
			if got := sc.Hello().Stack.String(); got != tc.want {
				t.Fatalf("the listener got stack %s, want %s", got, tc.want)
			}
			go io.Copy(sc, sc)
			echoOnce(t, c)
		})
	}
}

// TestRule: QUIC is chosen by a route of the config file, as any stack
// is; a destination no route sends over quic is dialed as the default
// says (here directly, on TCP, where this listener does not listen).
func TestRule(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	srv := echoListener(t, testKey)
	_, port, _ := net.SplitHostPort(srv)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vlink.key"), testKey, 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vlink.toml")
	conf := fmt.Sprintf("key_file = \"vlink.key\"\n\n[[route]]\nhost = \"127.0.0.1\"\nports = \"%s\"\nstack = \"zstd+quic\"\n", port)
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := vlink.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	d := &vlink.Dialer{Config: cfg}
	defer d.Close()
	c, err := d.Dial("tcp", srv)
	if err != nil {
		t.Fatalf("the route's dial: %v", err)
	}
	echoOnce(t, c)
	c.Close()
	if _, err := d.Dial("tcp", net.JoinHostPort("localhost", port)); err == nil {
		t.Fatal("a destination no route names went over quic")
	}
}

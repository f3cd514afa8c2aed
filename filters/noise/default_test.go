package noise_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// hostAddr returns a non-loopback IPv4 address of this host, so that a
// dial to it counts as leaving the host.
func hostAddr(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP
		}
	}
	testenv.Missing(t, "a non-loopback IPv4 address on this host")
	return nil
}

// TestEncryptedViaGateway: a plain stack sent via a gateway beyond
// loopback still sends a hello (it names the target), so it gets the
// noise layer too.
func TestEncryptedViaGateway(t *testing.T) {
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Targets: []selector.Rule{{Host: "127.0.0.1", Ports: "9"}}}}
	l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(hostAddr(t).String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := l.AcceptVLink()
		if err != nil {
			return
		}
		seen <- c.Hello().Stack.String()
		c.Close()
	}()
	d := vlink.Dialer{Stack: vlink.MustParse("tcp"), Via: l.Addr().String(), Key: key}
	c, err := d.Dial("tcp", "127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if s := <-seen; s != "noise" {
		t.Errorf("the gateway saw stack %q, want noise", s)
	}
}

// TestEncryptedByDefault: with a key, a stack sent beyond loopback gets
// the noise layer at the bottom of its mirrored layers unless the dialer
// opts out, and a listener with a key refuses plaintext from beyond
// loopback unless it opts out; on loopback nothing changes.
func TestEncryptedByDefault(t *testing.T) {
	remote := hostAddr(t)
	for _, tc := range []struct {
		name            string
		listenOn        net.IP
		stack           string
		dialerPlaintext bool
		listenPlaintext bool
		want            string   // the stack the listener sees; "" for a refusal
		layers          []string // the listener's Policy.Layers
	}{
		{"beyond loopback", remote, "zstd", false, false, "zstd+noise", nil},
		// The listener hands out the stream of the nested hello ("zstd");
		// the bottom one ("mux+noise") got through, so it was encrypted:
		// plaintext from beyond loopback is refused.
		{"beyond loopback, multi-link", remote, "zstd+mux", false, false, "zstd", nil},
		{"beyond loopback, noise already there", remote, "noise+zstd", false, false, "noise+zstd", nil},
		{"loopback", net.IPv4(127, 0, 0, 1), "zstd", false, false, "zstd", nil},
		{"dialer opts out", remote, "zstd", true, false, "", nil},
		{"both opt out", remote, "zstd", true, true, "zstd", nil},
		{"the listener lists its layers", remote, "zstd", false, false, "zstd+noise", []string{"zstd"}}, // noise comes with the key
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, InsecurePlaintext: tc.listenPlaintext, Layers: tc.layers}}
			l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(tc.listenOn.String(), "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			seen := make(chan string, 1)
			go func() {
				c, err := l.AcceptVLink()
				if err != nil {
					return
				}
				defer c.Close()
				seen <- c.Hello().Stack.String()
				io.Copy(c, c)
			}()
			d := vlink.Dialer{Stack: vlink.MustParse(tc.stack), Key: key, InsecurePlaintext: tc.dialerPlaintext}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if tc.want == "" {
				if !errors.Is(err, vlink.ErrNotAllowed) {
					t.Fatalf("dial: %v, want a refusal matching ErrNotAllowed", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := []byte("hello through " + tc.stack)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
				t.Fatalf("echo %q, %v", got, err)
			}
			if s := <-seen; s != tc.want {
				t.Errorf("the listener saw stack %s, want %s", s, tc.want)
			}
		})
	}
}

// TestEncryptedThroughRoute: a plain stack through fwd nodes beyond
// loopback gets the noise layer end to end, with the last node as the
// gateway, and the gateway learns the origin the first node vouched for.
func TestEncryptedThroughRoute(t *testing.T) {
	host := hostAddr(t).String()
	listen := func(p vlink.Policy, admit func(context.Context, *vlink.Hello) (any, error)) *vlink.Listener {
		lc := vlink.ListenConfig{Policy: p, Admit: admit}
		l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	gw := listen(vlink.Policy{Key: key, Targets: []selector.Rule{{Host: "127.0.0.1", Ports: "9"}}}, nil)
	node := listen(vlink.Policy{Key: key, Hops: []selector.Rule{{Host: host, Ports: "*"}}},
		func(ctx context.Context, h *vlink.Hello) (any, error) { return h.DialNextHop(ctx, nil) })
	go func() {
		c, err := node.AcceptVLink()
		if err != nil {
			return
		}
		next := c.Admitted().(net.Conn)
		go func() { io.Copy(next, c); next.Close() }()
		io.Copy(c, next)
		c.Close()
	}()
	seen := make(chan *vlink.Hello, 1)
	go func() {
		c, err := gw.AcceptVLink()
		if err != nil {
			return
		}
		seen <- c.Hello()
		c.Close()
	}()
	d := vlink.Dialer{Stack: vlink.MustParse("fwd:via=" + gw.Addr().String() + "+fwd:via=" + node.Addr().String()), Key: key}
	c, err := d.Dial("tcp", "127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := <-seen
	if h.Stack.String() != "noise" || h.Target != "127.0.0.1:9" || h.Forwarded != 1 {
		t.Errorf("the gateway saw stack %q target %q forwarded %d, want noise, 127.0.0.1:9, 1", h.Stack, h.Target, h.Forwarded)
	}
	if h.RemoteAddr.String() != c.LocalAddr().String() {
		t.Errorf("the gateway saw the connection from %s, want its origin %s", h.RemoteAddr, c.LocalAddr())
	}
}

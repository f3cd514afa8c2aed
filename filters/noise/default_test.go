package noise_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
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
		// Noise above a multi-link layer encrypts each nested stream; the
		// listener checks it there.
		{"beyond loopback, noise above mux", remote, "noise+mux", false, false, "noise", nil},
		{"beyond loopback, noise above parallel", remote, "zstd+noise+parallel:streams=2", false, false, "zstd+noise", nil},
		{"beyond loopback, noise above nested multi-link", remote, "noise+mux+parallel:streams=2", false, false, "noise", nil},
		{"dialer opts out, multi-link", remote, "zstd+mux", true, false, "", nil},
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
				if err == nil {
					// mux sends its nested hello with the first bytes: the
					// refusal comes with the first read.
					c.Write([]byte("x"))
					_, err = c.Read(make([]byte, 1))
					c.Close()
				}
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

// TestEncryptedThroughProxy: a stack whose proxy is beyond loopback gets
// the noise layer even though its destination is a loopback listener,
// which sees the proxy's loopback address and cannot ask for it: the
// wire to the proxy carries no byte of the payload in clear.
func TestEncryptedThroughProxy(t *testing.T) {
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make(chan string, 2)
	go func() {
		for {
			c, err := l.AcceptVLink()
			if err != nil {
				return
			}
			seen <- c.Hello().Stack.String()
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	const size = 1 << 16
	payload := testnet.RandomBytes(size, size)[100:164] // what testnet.Echoed sends
	remote := hostAddr(t).String()
	for _, tc := range []struct{ name, proxy, stack, want string }{
		{"beyond loopback", remote, "identity+socks5:addr=%s", "identity+noise"},
		{"beyond loopback, proxy URL", remote, "identity+socks5h://%s", "identity+noise"},
		{"beyond loopback, multi-link", remote, "mux+socks5:addr=%s", ""}, // the listener hands out the nested hello
		{"on loopback", "127.0.0.1", "identity+socks5:addr=%s", "identity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, wire := recordingSOCKS(t, tc.proxy)
			d := vlink.Dialer{Stack: vlink.MustParse(fmt.Sprintf(tc.stack, proxy)), Key: key}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := testnet.Echoed(c, size); err != nil {
				t.Fatal(err)
			}
			if s := <-seen; tc.want != "" && s != tc.want {
				t.Errorf("the listener saw stack %s, want %s", s, tc.want)
			}
			beyond := tc.proxy != "127.0.0.1"
			if clear := bytes.Contains(wire(), payload); clear == beyond {
				t.Errorf("payload in clear on the wire to the proxy: %v, want %v", clear, !beyond)
			}
		})
	}
}

// recordingSOCKS starts a SOCKS server on host and returns its address
// and what clients sent it so far.
func recordingSOCKS(t *testing.T, host string) (string, func() []byte) {
	var (
		mu  sync.Mutex
		got []byte
	)
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &socks.Server{Dialer: &net.Dialer{}}
	testnet.Serve(t, l, func(c net.Conn) {
		defer c.Close()
		rec := &recorder{Conn: c, record: func(b []byte) { mu.Lock(); got = append(got, b...); mu.Unlock() }}
		next, _, err := srv.Handshake(context.Background(), rec)
		if err != nil {
			return
		}
		defer next.Close()
		go func() { io.Copy(next, rec); netconn.CloseWrite(next) }()
		io.Copy(c, next)
	})
	return l.Addr().String(), func() []byte { mu.Lock(); defer mu.Unlock(); return bytes.Clone(got) }
}

// recorder is a net.Conn that records what it reads.
type recorder struct {
	net.Conn
	record func([]byte)
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.record(p[:n])
	return n, err
}

// TestDialerKeyWithConfig: Dialer.Key applies when the Config's route
// picks the stack, as when Dialer.Stack does: the keyed listener admits
// the dialer, and the noise layer comes with the key beyond loopback.
func TestDialerKeyWithConfig(t *testing.T) {
	for _, tc := range []struct {
		name      string
		listenOn  string
		configKey []byte
		want      string
	}{
		{"loopback, no key in the config", "127.0.0.1", nil, "zstd"},
		{"beyond loopback, no key in the config", hostAddr(t).String(), nil, "zstd+noise"},
		{"beyond loopback, another key in the config", hostAddr(t).String(), []byte("another key, which the listener refuses"), "zstd+noise"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key}}
			l, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(tc.listenOn, "0"))
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
				testnet.Echo(c)
			}()
			cfg, err := vlink.NewConfig([]selector.Rule{{Host: tc.listenOn, Stack: "zstd"}}, selector.Rule{}, tc.configKey)
			if err != nil {
				t.Fatal(err)
			}
			d := vlink.Dialer{Config: cfg, Key: key}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := testnet.Echoed(c, 1000); err != nil {
				t.Fatal(err)
			}
			if s := <-seen; s != tc.want {
				t.Errorf("the listener saw stack %s, want %s", s, tc.want)
			}
		})
	}
}

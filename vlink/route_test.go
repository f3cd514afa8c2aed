package vlink_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	_ "github.com/vlink-dev/vlink/filters/fwd"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// node is a forwarding VLink listener, as vlink serve --hop runs one: it
// carries each connection on to the next node its hello names, and
// records what it relayed towards it.
type node struct {
	l    *vlink.Listener
	addr string
	mu   sync.Mutex
	seen bytes.Buffer // what the dialer's side sent through this node
}

func (n *node) saw() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]byte(nil), n.seen.Bytes()...)
}

type recordingConn struct {
	net.Conn
	n *node
}

func (c recordingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.mu.Lock()
	c.n.seen.Write(p[:k])
	c.n.mu.Unlock()
	return k, err
}

// startNode starts a node that may forward to the hops allow matches.
func startNode(t *testing.T, k []byte, allow ...string) *node {
	t.Helper()
	n := &node{}
	p := vlink.Policy{Key: k}
	for _, a := range allow {
		p.Hops = append(p.Hops, selector.Rule{Host: a, Ports: "*"})
	}
	lc := vlink.ListenConfig{Policy: p, Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
		if len(h.Hops) == 0 {
			return nil, errors.New("this test node only forwards")
		}
		c, err := h.DialNextHop(ctx, nil)
		var re *vlink.RefusedError
		if err != nil && !errors.As(err, &re) {
			return nil, &vlink.RefusedError{Code: vlink.CodeUnreachable, Reason: "next node " + h.Hops[0] + ": " + err.Error()}
		}
		return c, err
	}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.l, n.addr = l, l.Addr().String()
	testnet.Serve(t, l, func(c net.Conn) {
		next := c.(*vlink.Conn).Admitted().(net.Conn)
		netconn.Relay(recordingConn{c, n}, next)
	})
	return n
}

// peer starts the VLink listener at the end of a route: it echoes, and
// hands over the hello of each connection.
func peer(t *testing.T, p vlink.Policy) (string, <-chan *vlink.Hello) {
	t.Helper()
	hellos := make(chan *vlink.Hello, 4)
	l, err := (&vlink.ListenConfig{Policy: p}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		hellos <- c.(*vlink.Conn).Hello()
		io.Copy(c, c)
	})
	return l.Addr().String(), hellos
}

func TestFwdChain(t *testing.T) {
	for _, k := range [][]byte{nil, key} {
		name := "no key"
		if k != nil {
			name = "key"
		}
		t.Run(name, func(t *testing.T) {
			dest, hellos := peer(t, vlink.Policy{Key: k})
			gw2 := startNode(t, k, "127.0.0.1")
			gw1 := startNode(t, k, "127.0.0.1")
			d := vlink.Dialer{Stack: vlink.MustParse("test-xor:key=7+fwd:via=" + gw2.addr + "+fwd:via=" + gw1.addr), Key: k}
			c, err := d.Dial("tcp", dest)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := bytes.Repeat([]byte("through two nodes "), 1000)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			if testnet.Sum(got) != testnet.Sum(msg) {
				t.Fatal("bytes changed on the way")
			}
			h := <-hellos
			if h.Stack.String() != "test-xor:key=7" || h.Forwarded != 2 {
				t.Errorf("peer saw stack %q forwarded %d, want test-xor:key=7 forwarded 2", h.Stack, h.Forwarded)
			}
			// The origin reaches the peer when the nodes can vouch for it.
			origin := gw2.addr
			if k != nil {
				origin = c.LocalAddr().String()
			}
			if h.RemoteAddr.String() == origin && k == nil {
				t.Errorf("peer took %s, the last node, for the origin without a key to vouch for it", origin)
			}
			if k != nil && h.RemoteAddr.String() != origin {
				t.Errorf("peer saw the connection from %s, want the origin %s", h.RemoteAddr, origin)
			}
			// The filter runs end to end: the nodes carry xored bytes.
			for _, n := range []*node{gw1, gw2} {
				if bytes.Contains(n.saw(), []byte("through two nodes")) {
					t.Errorf("node %s saw the plaintext: a layer above the route ran on the way", n.addr)
				}
				if !bytes.Contains(n.saw(), bytes.Repeat([]byte{'t' ^ 7}, 1)) {
					t.Errorf("node %s carried nothing", n.addr)
				}
			}
		})
	}
}

func TestFwdPlainGateway(t *testing.T) {
	// Nothing to mirror: the topmost node is the gateway, which forwards
	// to the plain destination.
	dest := testnet.EchoServer(t)
	gw1 := startNode(t, nil, "127.0.0.1")
	var lc vlink.ListenConfig
	lc.Policy.Targets = []selector.Rule{{Host: "127.0.0.1", Ports: "*"}}
	lc.Admit = func(ctx context.Context, h *vlink.Hello) (any, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", h.Target)
	}
	gw, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, gw, func(c net.Conn) { netconn.Relay(c, c.(*vlink.Conn).Admitted().(net.Conn)) })
	d := vlink.Dialer{Stack: vlink.MustParse("fwd:via=" + gw.Addr().String() + "+fwd:via=" + gw1.addr)}
	c, err := d.Dial("tcp", dest)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testnet.RoundTrip(t, c, 1<<20)
}

func TestFwdRefusals(t *testing.T) {
	dest, _ := peer(t, vlink.Policy{Key: key, Layers: []string{}})
	keyless, _ := peer(t, vlink.Policy{})
	closed := testnet.RefusedAddr(t)
	open := startNode(t, key, "127.0.0.1", "localhost")
	strict := startNode(t, key, "*.example")
	loopback := strings.Replace(open.addr, "127.0.0.1", "localhost", 1)
	for _, tc := range []struct {
		name  string
		stack string // with %s for the destination's route layers
		dest  string
		want  error
		code  vlink.RefuseCode
		hop   int
		addr  string
	}{
		{"first node refuses the next", "test-xor+fwd:via=" + strict.addr, dest, vlink.ErrNotAllowed, vlink.CodeTarget, 1, strict.addr},
		{"second node refuses the next", "test-xor+fwd:via=" + strict.addr + "+fwd:via=" + open.addr, dest, vlink.ErrNotAllowed, vlink.CodeTarget, 2, strict.addr},
		{"next node unreachable", "test-xor+fwd:via=" + open.addr, closed, vlink.ErrUnreachable, vlink.CodeUnreachable, 1, open.addr},
		{"peer refuses the stack", "test-xor+fwd:via=" + open.addr, dest, vlink.ErrNotAllowed, vlink.CodeLayer, 2, dest},
		{"peer has no key to check the origin by", "test-xor+fwd:via=" + open.addr, keyless, vlink.ErrAuth, vlink.CodeAuthRequired, 2, keyless},
		{"loop through another spelling", "test-xor+fwd:via=" + loopback + "+fwd:via=" + open.addr, dest, vlink.ErrLoop, vlink.CodeLoop, 2, loopback},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := vlink.Dialer{Stack: vlink.MustParse(tc.stack), Key: key}
			c, err := d.Dial("tcp", tc.dest)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var re *vlink.RefusedError
			if !errors.Is(err, tc.want) || !errors.As(err, &re) {
				t.Fatalf("dial: %v, want a refusal matching %v", err, tc.want)
			}
			if re.Code != tc.code || re.Hop != tc.hop || re.HopAddr != tc.addr {
				t.Fatalf("refusal %v at hop %d (%s), want %v at hop %d (%s)", re.Code, re.Hop, re.HopAddr, tc.code, tc.hop, tc.addr)
			}
			if !strings.Contains(err.Error(), tc.addr) {
				t.Errorf("the error does not name the node that refused: %v", err)
			}
		})
	}
}

func TestFwdRouteChecks(t *testing.T) {
	for _, tc := range []struct{ stack, want string }{
		{"fwd:via=a:1+test-xor", "must sit above every route layer"},
		{"fwd", "missing required parameter via"},
		{"fwd:via=a:1+fwd:via=b:2+fwd:via=c:3+fwd:via=d:4+fwd:via=e:5+fwd:via=f:6+fwd:via=g:7+fwd:via=h:8+fwd:via=i:9", "at most 8"},
	} {
		if _, err := vlink.Parse(tc.stack); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", tc.stack, err, tc.want)
		}
	}
	for _, dest := range []string{"127.0.0.1:10", "127.0.0.1:8"} {
		d := vlink.Dialer{Stack: vlink.MustParse("test-xor+fwd:via=127.0.0.1:8+fwd:via=127.0.0.1:9+fwd:via=127.0.0.1:9")}
		if dest == "127.0.0.1:8" {
			d.Stack = vlink.MustParse("test-xor+fwd:via=127.0.0.1:8+fwd:via=127.0.0.1:9")
		}
		if _, err := d.Dial("tcp", dest); !errors.Is(err, vlink.ErrLoop) {
			t.Errorf("a route naming one node twice: %v, want ErrLoop", err)
		}
	}
}

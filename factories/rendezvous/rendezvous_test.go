package rendezvous

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/factories/socks"
	_ "github.com/vlink-dev/vlink/filters/compress"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var networkKey = []byte("0123456789abcdef-network-key")

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// network starts a relay on loopback and returns its address.
func network(t *testing.T) string {
	t.Helper()
	r, err := control.NewRelay(control.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := r.Listen(context.Background(), "127.0.0.1:0", networkKey)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { r.Serve(l); close(done) }()
	t.Cleanup(func() { r.Close(); <-done })
	return l.Addr().String()
}

func node(t *testing.T, relay, name string) *control.Node {
	t.Helper()
	n, err := control.Connect(ctxT(t), control.Config{Name: name, Key: vlink.NodeKey(networkKey, name), Relays: []string{relay}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// pathListener reports the path each connection came by.
type pathListener struct {
	net.Listener
	paths chan string
}

func (l pathListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.paths <- c.(*control.Conn).Path()
	}
	return c, err
}

// sumServer exposes port 5432 of n behind a vlink listener: each
// connection gets back the SHA-256 of what it sent. It returns the
// paths and the stacks the connections came with.
func sumServer(t *testing.T, n *control.Node) (paths chan string, stacks chan string) {
	t.Helper()
	policy := vlink.Policy{Targets: []selector.Rule{{Host: "localhost", Ports: "5432", Action: selector.Direct}}}
	nl, err := n.Listen(func(from string, port uint16) error {
		return policy.AllowsTarget(net.JoinHostPort("localhost", "5432"))
	})
	if err != nil {
		t.Fatal(err)
	}
	paths, stacks = make(chan string, 8), make(chan string, 8)
	l, err := (&vlink.ListenConfig{Policy: policy}).NewListener(pathListener{nl, paths})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.AcceptVLink()
			if err != nil {
				return
			}
			stacks <- c.Hello().Stack.String()
			go func() {
				defer c.Close()
				data, err := io.ReadAll(c)
				if err != nil {
					return
				}
				sum := sha256.Sum256(data)
				c.Write(sum[:])
			}()
		}
	}()
	return paths, stacks
}

// sumThrough sends data on c and checks the checksum that comes back.
func sumThrough(t *testing.T, c net.Conn, data []byte) {
	t.Helper()
	go func() { c.Write(data); c.(interface{ CloseWrite() error }).CloseWrite() }()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(c)
	if want := sha256.Sum256(data); err != nil || !bytes.Equal(got, want[:]) {
		t.Fatalf("checksum %x (%v), want %x", got, err, want)
	}
}

// TestFactories: a stack's factory chooses the path to a node, the
// filters above it run end to end over the encryption layer, and a path
// that cannot be taken is an error that says why.
func TestFactories(t *testing.T) {
	relay := network(t)
	alice, bob, carol := node(t, relay, "alice"), node(t, relay, "bob"), node(t, relay, "carol")
	paths, stacks := sumServer(t, bob)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.ServeReverse(rl); err != nil { // alice accepts reverse connections, carol does not
		t.Fatal(err)
	}
	data := make([]byte, 2<<20)
	rand.Read(data[:1<<20]) // and 1 MiB of zeros, for zstd

	for _, tt := range []struct {
		stack string
		from  *control.Node
		path  string
	}{
		{"zstd+relay", alice, "relay"},
		{"zstd+reverse", alice, "reverse"},
		{"zstd+reverse:fallback=false", alice, "reverse"},
		{"zstd", alice, "reverse"}, // no factory: the best path
		{"zstd+reverse", carol, "relay"},
		{"zstd+splice", alice, "splice"},
		{"zstd+splice:fallback=false", carol, "splice"},
		{"zstd", carol, "splice"},
	} {
		t.Run(tt.from.Name()+" "+tt.stack, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Network: tt.from}
			defer d.Close()
			c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if p, s := <-paths, <-stacks; p != tt.path || s != "zstd+noise" {
				t.Fatalf("came by %s with stack %s, want %s with zstd+noise", p, s, tt.path)
			}
			if p := vlink.PathOf(c); p != tt.path {
				t.Fatalf("the dialer's connection says it came by %q, want %q", p, tt.path)
			}
			sumThrough(t, c, data)
		})
	}

	for _, tt := range []struct {
		name, stack, addr string
		from              vlink.NodeDialer
		is                error  // matched with errors.Is, if set
		says              string // in the error's text, if set
	}{
		{"reverse only from a node that accepts none", "zstd+reverse:fallback=false", "bob.vlink.alt:5432", carol, control.ErrNoReverse, ""},
		{"no such node", "relay", "nobody.vlink.alt:5432", alice, control.ErrNoNode, ""},
		{"not a node's address", "relay", "127.0.0.1:5432", alice, nil, "reaches the nodes of a vlink network"},
		{"a network that is not a control.Node", "relay", "bob.vlink.alt:5432", fakeNetwork{}, nil, "needs a vlink network"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Network: tt.from}
			defer d.Close()
			c, err := d.DialContext(ctxT(t), "tcp", tt.addr)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if (tt.is != nil && !errors.Is(err, tt.is)) || (tt.says != "" && !strings.Contains(err.Error(), tt.says)) {
				t.Fatalf("dial = %v, want %v %q", err, tt.is, tt.says)
			}
		})
	}
	t.Run("a factory below the node's", func(t *testing.T) {
		d := &vlink.Dialer{Stack: vlink.MustParse("zstd+socks5:addr=127.0.0.1:1080+relay"), Network: alice}
		if _, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432"); !errors.Is(err, vlink.ErrBadStack) {
			t.Fatalf("dial = %v, want ErrBadStack", err)
		}
	})
}

// fakeNetwork is a NodeDialer that is not a *control.Node.
type fakeNetwork struct{}

func (fakeNetwork) DialNode(context.Context, string, uint16) (net.Conn, error) {
	return nil, errors.New("fake")
}

// TestPathsFromEnv: VLINK_PATHS_ONLY and VLINK_PATHS_EXCLUDE narrow the
// paths the network may take to a node, as they narrow best-effort
// routes: excluding the one it would take moves it to the next, and
// excluding every one it can take is an error, never a path it may not.
func TestPathsFromEnv(t *testing.T) {
	relay := network(t)
	carol, bob := node(t, relay, "carol"), node(t, relay, "bob") // carol accepts no reverse connections
	paths, _ := sumServer(t, bob)
	t.Setenv("VLINK_CONFIG", "")
	for _, tt := range []struct {
		only, exclude string
		path          string // "" for an error
		is            error
	}{
		{"", "", "splice", nil},
		{"", "splice", "relay", nil},
		{"relay", "", "relay", nil},
		{"reverse,splice", "", "splice", nil},
		{"", "relay,splice", "", control.ErrNoReverse},
		{"", "relay,splice,reverse", "", vlink.ErrNoWay},
	} {
		t.Run("only="+tt.only+" exclude="+tt.exclude, func(t *testing.T) {
			t.Setenv(vlink.EnvPathsOnly, tt.only)
			t.Setenv(vlink.EnvPathsExclude, tt.exclude)
			cfg, err := vlink.ConfigFromEnv()
			if err != nil {
				t.Fatal(err)
			}
			d := &vlink.Dialer{Config: cfg, Network: carol}
			defer d.Close()
			c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
			if tt.path == "" {
				if err == nil {
					c.Close()
				}
				if !errors.Is(err, tt.is) {
					t.Fatalf("dial = %v, want %v", err, tt.is)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if p, theirs := vlink.PathOf(c), <-paths; p != tt.path || theirs != tt.path {
				t.Fatalf("came by %q (bob's end: %q), want %q", p, theirs, tt.path)
			}
			sumThrough(t, c, []byte("through the allowed path"))
		})
	}
}

// TestTryListsOnNodes: a try list is refused where it cannot apply, when
// the config is read (a way through the network for destinations that
// are not nodes, a try list for node names only), and a dial to a node
// that a wider best-effort rule matches is refused, saying what to add:
// no try list is silently ignored.
func TestTryListsOnNodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule selector.Rule
	}{
		{"relay for an IP", selector.Rule{Host: "10.0.0.0/8", Try: []string{"direct", "zstd+relay"}}},
		{"reverse for a name", selector.Rule{Host: "*.corp.example", Try: []string{"reverse"}}},
		{"relay for any host", selector.Rule{Host: "*", Try: []string{"direct", "relay"}}},
		{"try list for nodes", selector.Rule{Host: "*.vlink.alt", Try: []string{"zstd", "lz4"}}},
		{"try list for one node", selector.Rule{Host: "db.vlink.alt.", Try: []string{"zstd"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := vlink.NewConfig([]selector.Rule{tc.rule}, selector.Rule{}, nil)
			if !errors.Is(err, vlink.ErrBadStack) || !strings.Contains(err.Error(), "route 1") {
				t.Fatalf("NewConfig: %v, want ErrBadStack naming route 1", err)
			}
		})
	}

	relay := network(t)
	n := node(t, relay, "laptop")
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "*", Try: []string{"direct", "zstd"}}}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := vlink.Dialer{Config: cfg, Network: n}
	defer d.Close()
	c, err := d.DialContext(ctxT(t), "tcp", "db.vlink.alt:5432")
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, vlink.ErrBadStack) || !strings.Contains(err.Error(), "put a rule for *.vlink.alt before it") {
		t.Fatalf("a node matched by a best-effort rule: %v, want ErrBadStack saying what to add", err)
	}
}

package vlink_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// nodeListen starts a VLink listener on loopback that echoes every
// connection and reports, in order, the node each accepted one proved.
func nodeListen(t *testing.T, p vlink.Policy) (*vlink.Listener, <-chan string) {
	t.Helper()
	lc := vlink.ListenConfig{Policy: p}
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nodes := make(chan string, 16)
	testnet.Serve(t, l, func(c net.Conn) {
		if h := c.(*vlink.Conn).Hello(); h != nil {
			nodes <- h.Node
		} else {
			nodes <- "(plain)"
		}
		io.Copy(c, c)
	})
	return l, nodes
}

func nextNode(t *testing.T, nodes <-chan string) string {
	t.Helper()
	select {
	case n := <-nodes:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("the listener accepted nothing")
		return ""
	}
}

// A node proving its derived key is accepted under its name, whatever the
// stack: plain hellos, the noise layer (keyed with the node's key on both
// sides), and multi-link layers whose nested hellos inherit the name.
func TestNodeAccepted(t *testing.T) {
	alice := vlink.NodeKey(key, "alice")
	for _, stack := range []string{"test-xor", "noise", "test-xor+noise", "mux", "noise+mux", "mux+noise", "test-xor+mux+noise"} {
		t.Run(stack, func(t *testing.T) {
			l, nodes := nodeListen(t, vlink.Policy{Key: key})
			d := &vlink.Dialer{Stack: vlink.MustParse(stack), Node: "alice", Key: alice}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 100<<10+3)
			if n := nextNode(t, nodes); n != "alice" {
				t.Fatalf("Hello().Node = %q, want alice", n)
			}
		})
	}
}

// A hello without a node is unchanged: proven with the network key
// itself, and Hello.Node is empty.
func TestNodeNone(t *testing.T) {
	l, nodes := nodeListen(t, vlink.Policy{Key: key})
	for _, stack := range []string{"test-xor", "noise", "noise+mux"} {
		t.Run(stack, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(stack), Key: key}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 1000)
			if n := nextNode(t, nodes); n != "" {
				t.Fatalf("Hello().Node = %q, want none", n)
			}
		})
	}
}

// A name the dialer cannot prove is refused, and the listener accepts no
// connection for it.
func TestNodeRefused(t *testing.T) {
	other := []byte("another network key, 16+ bytes")
	tests := []struct {
		name    string
		policy  vlink.Policy
		node    string
		key     []byte
		code    vlink.RefuseCode
		mention string
	}{
		{"claims another node", vlink.Policy{Key: key}, "bob", vlink.NodeKey(key, "alice"), vlink.CodeAuthFailed, `node "bob"`},
		{"network key not derived", vlink.Policy{Key: key}, "bob", key, vlink.CodeAuthFailed, `node "bob"`},
		{"listener of another network", vlink.Policy{Key: other}, "alice", vlink.NodeKey(key, "alice"), vlink.CodeAuthFailed, "does not match"},
		{"keyless listener", vlink.Policy{}, "alice", vlink.NodeKey(key, "alice"), vlink.CodeAuthRequired, "needs a listener key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, nodes := nodeListen(t, tt.policy)
			d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Node: tt.node, Key: tt.key}
			c, err := d.Dial("tcp", l.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var re *vlink.RefusedError
			if !errors.Is(err, vlink.ErrAuth) || !errors.Is(err, vlink.ErrRefused) || !errors.As(err, &re) || re.Code != tt.code {
				t.Fatalf("err = %v, want a refusal %v matching ErrAuth", err, tt.code)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.mention)
			}
			// The next connection the listener accepts is this honest
			// one: the refused dial never reached Accept.
			ok := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Node: "carol", Key: vlink.NodeKey(tt.policy.Key, "carol")}
			if tt.policy.Key == nil {
				ok = vlink.Dialer{Stack: vlink.MustParse("test-xor")}
			}
			c, err = ok.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("listener stopped serving: %v", err)
			}
			testnet.RoundTrip(t, c, 1000)
			c.Close()
			want := "carol"
			if tt.policy.Key == nil {
				want = ""
			}
			if n := nextNode(t, nodes); n != want {
				t.Fatalf("the listener accepted node %q first, want %q", n, want)
			}
		})
	}
}

func TestValidNodeName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"alice", true},
		{"node-7", true},
		{"a1-b2", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{"Alice", false},
		{"-a", false},
		{"a-", false},
		{"7a", false},
		{strings.Repeat("a", 64), false},
		{"a.b", false},
		{"a_b", false},
		{"a b", false},
		{"é", false},
		{"aé", false},
	}
	l, _ := nodeListen(t, vlink.Policy{Key: key})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := vlink.ValidNodeName(tt.name); got != tt.ok {
				t.Fatalf("ValidNodeName(%q) = %v, want %v", tt.name, got, tt.ok)
			}
			if tt.ok || tt.name == "" { // "" is no node at all
				return
			}
			d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Node: tt.name, Key: vlink.NodeKey(key, tt.name)}
			c, err := d.Dial("tcp", l.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, vlink.ErrBadNodeName) {
				t.Fatalf("err = %v, want ErrBadNodeName", err)
			}
		})
	}
}

// A node name needs the node's key to prove it.
func TestNodeWithoutKey(t *testing.T) {
	l, _ := nodeListen(t, vlink.Policy{Key: key})
	d := vlink.Dialer{Stack: vlink.MustParse("test-xor"), Node: "alice"}
	c, err := d.Dial("tcp", l.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("dial succeeded")
	}
	if !errors.Is(err, vlink.ErrKeyRequired) {
		t.Fatalf("err = %v, want ErrKeyRequired", err)
	}
}

func TestNodeKey(t *testing.T) {
	a := vlink.NodeKey(key, "alice")
	// 32 bytes of HMAC in base64: text a key file holds as it is.
	if raw, err := base64.StdEncoding.DecodeString(string(a)); err != nil || len(raw) != 32 {
		t.Fatalf("NodeKey = %q, want 32 bytes in base64 (%v)", a, err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/alice.key", append(a, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if read, err := vlink.ReadKeyFile(dir + "/alice.key"); err != nil || !bytes.Equal(read, a) {
		t.Fatalf("ReadKeyFile of a node key file = %q, %v", read, err)
	}
	if !bytes.Equal(a, vlink.NodeKey(key, "alice")) {
		t.Fatal("NodeKey is not deterministic")
	}
	for _, other := range [][]byte{vlink.NodeKey(key, "bob"), vlink.NodeKey([]byte("another network key, 16+ bytes"), "alice"), key} {
		if bytes.Equal(a, other) {
			t.Fatalf("NodeKey(key, alice) = %x collides", a)
		}
	}
}

// A config's node (node = "…" in the file, or VLINK_NODE) names the node
// in the hellos of its routes, proven with the config's key.
func TestConfigNode(t *testing.T) {
	l, nodes := nodeListen(t, vlink.Policy{Key: key})
	dir := t.TempDir()
	writeFile(t, dir, "k", string(vlink.NodeKey(key, "alice")), 0o600)
	path := writeFile(t, dir, "config.toml", "key_file = \"k\"\nnode = \"alice\"\n\n[default]\nstack = \"test-xor\"\n", 0o644)
	cfg, err := vlink.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Node != "alice" {
		t.Fatalf("Config.Node = %q, want alice", cfg.Node)
	}
	d := vlink.Dialer{Config: cfg}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	if n := nextNode(t, nodes); n != "alice" {
		t.Fatalf("Hello().Node = %q, want alice", n)
	}

	// A Dialer's own key comes with its own node, not the config's.
	d = vlink.Dialer{Config: cfg, Stack: vlink.MustParse("test-xor"), Key: key}
	if c, err = d.Dial("tcp", l.Addr().String()); err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	if n := nextNode(t, nodes); n != "" {
		t.Fatalf("Hello().Node = %q, want none", n)
	}

	bad := writeFile(t, dir, "bad.toml", "node = \"Alice\"\n", 0o644)
	if _, err := vlink.LoadConfig(bad); !errors.Is(err, vlink.ErrBadNodeName) {
		t.Fatalf("LoadConfig with node Alice = %v, want ErrBadNodeName", err)
	}

	t.Setenv(vlink.EnvConfig, path)
	t.Setenv(vlink.EnvNode, "bob")
	t.Setenv(vlink.EnvStack, "test-xor:key=3")
	if cfg, err = vlink.ConfigFromEnv(); err != nil || cfg.Node != "bob" {
		t.Fatalf("VLINK_NODE=bob: Config.Node = %q, %v", cfg.Node, err)
	}
	t.Setenv(vlink.EnvNode, "b.o.b")
	if _, err := vlink.ConfigFromEnv(); !errors.Is(err, vlink.ErrBadNodeName) {
		t.Fatalf("VLINK_NODE=b.o.b: %v, want ErrBadNodeName", err)
	}
}

package control

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	_ "github.com/vlink-dev/vlink/filters/compress"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// TestDialNodeAddress: vlink.Dialer reaches NODE.vlink.alt:PORT through
// the network; the stack runs end to end with the encryption layer at
// its bottom, and the node's listener knows who dialed.
func TestDialNodeAddress(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	policy := vlink.Policy{Targets: []selector.Rule{{Host: "localhost", Ports: "5432", Action: selector.Direct}}}
	nl, err := b.Listen(func(from string, port uint16) error {
		return policy.AllowsTarget(net.JoinHostPort("localhost", strconv.Itoa(int(port))))
	})
	if err != nil {
		t.Fatal(err)
	}
	lc := vlink.ListenConfig{Policy: policy}
	l, err := lc.NewListener(nl)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hellos := make(chan *vlink.Hello, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			hellos <- c.(*vlink.Conn).Hello()
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

	d := &vlink.Dialer{Stack: vlink.MustParse("zstd"), Network: a}
	defer d.Close()
	data := make([]byte, 4<<20)
	rand.Read(data[:1<<20]) // and 3 MiB of zeros, for zstd
	c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
	if err != nil {
		t.Fatal(err)
	}
	go func() { c.Write(data); c.(interface{ CloseWrite() error }).CloseWrite() }()
	got, err := io.ReadAll(c)
	c.Close()
	if want := sha256.Sum256(data); err != nil || !bytes.Equal(got, want[:]) {
		t.Fatalf("bob's checksum %x (%v), want %x", got, err, want)
	}
	h := <-hellos
	if h.Node != "alice" || h.Target != "localhost:5432" || h.Stack.String() != "zstd+noise" || !h.Authenticated {
		t.Fatalf("bob saw node %q target %q stack %q authenticated %v", h.Node, h.Target, h.Stack, h.Authenticated)
	}

	t.Run("not allowed", func(t *testing.T) {
		_, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:22")
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("dial to an unexposed port = %v, want ErrRefused", err)
		}
	})
	t.Run("plaintext refused", func(t *testing.T) {
		d := &vlink.Dialer{Stack: vlink.MustParse("tcp"), Network: a, InsecurePlaintext: true}
		_, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
		var re *vlink.RefusedError
		if !errors.As(err, &re) || re.Code != vlink.CodeLayer {
			t.Fatalf("a plaintext stack to a node = %v, want refused for its layers", err)
		}
	})
	t.Run("vlink.Dial", func(t *testing.T) {
		// The package-level Dial, once the program hands DefaultDialer
		// its network. An empty config file: the user's own is not read.
		empty := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(empty, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv(vlink.EnvConfig, empty)
		vlink.DefaultDialer.Network = a
		defer func() { vlink.DefaultDialer.Network = nil; vlink.DefaultDialer.Close() }()
		c, err := vlink.Dial("tcp", "bob.vlink.alt:5432")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(data[:1000])
		c.(interface{ CloseWrite() error }).CloseWrite()
		got, err := io.ReadAll(c)
		if want := sha256.Sum256(data[:1000]); err != nil || !bytes.Equal(got, want[:]) {
			t.Fatalf("bob's checksum %x (%v), want %x", got, err, want)
		}
		if h := <-hellos; h.Node != "alice" || h.Stack.String() != "noise" {
			t.Fatalf("bob saw node %q stack %q", h.Node, h.Stack)
		}
	})
	t.Run("no network", func(t *testing.T) {
		d := &vlink.Dialer{Stack: vlink.MustParse("zstd")}
		if _, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432"); !errors.Is(err, vlink.ErrNoNetwork) {
			t.Fatalf("dial = %v, want ErrNoNetwork", err)
		}
	})
}

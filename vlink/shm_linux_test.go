package vlink_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/vlink-dev/vlink/factories/shm"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// listenBoth listens with lc on a loopback port, on TCP and on shared
// memory (ListenConfig.Shm), each connection answering with the name of
// the network it came by.
func listenBoth(t *testing.T, lc vlink.ListenConfig) net.Listener {
	t.Helper()
	lc.Shm = true
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { io.WriteString(c, c.LocalAddr().Network()) })
	return l
}

// TestShmSelection: a VLink dial to a listener on this machine that
// also listens on shared memory (ListenConfig.Shm, vlink serve --shm) takes shared
// memory, unless told not to or its stack names its factory; a dial
// without a hello never does; "on" fails where shared memory is not
// offered, "auto" falls back to TCP.
func TestShmSelection(t *testing.T) {
	ctx := context.Background()
	tl := listenBoth(t, vlink.ListenConfig{})
	_, port, _ := net.SplitHostPort(tl.Addr().String())
	// A listener on TCP only.
	other, err := (&vlink.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, other, func(c net.Conn) { io.WriteString(c, c.LocalAddr().Network()) })

	for _, tc := range []struct {
		name, stack, env string
		shm              vlink.ShmMode
		addr             string
		want             string // the network that answered; "" for an error
	}{
		{name: "auto", stack: "identity", addr: tl.Addr().String(), want: "shm"},
		{name: "auto, by name", stack: "identity", addr: "localhost:" + port, want: "shm"},
		{name: "off", stack: "identity", shm: vlink.ShmOff, addr: tl.Addr().String(), want: "tcp"},
		{name: "off from the environment", stack: "identity", env: "off", addr: tl.Addr().String(), want: "tcp"},
		{name: "the stack names its factory", stack: "identity+tcp:nodelay=false", addr: tl.Addr().String(), want: "tcp"},
		{name: "no hello", stack: "tcp", addr: tl.Addr().String(), want: "tcp"},
		{name: "auto, not offered", stack: "identity", addr: other.Addr().String(), want: "tcp"},
		{name: "on, not offered", stack: "identity", shm: vlink.ShmOn, addr: other.Addr().String()},
		{name: "on from the environment, offered", stack: "identity", env: "on", addr: tl.Addr().String(), want: "shm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(vlink.EnvShm, tc.env)
			d := &vlink.Dialer{Stack: vlink.MustParse(tc.stack), Shm: tc.shm}
			defer d.Close()
			c, err := d.DialContext(ctx, "tcp", tc.addr)
			if tc.want == "" {
				if err == nil {
					c.Close()
					t.Fatal("the dial succeeded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil || string(got) != tc.want {
				t.Errorf("the listener on %q answered, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("a bad mode", func(t *testing.T) {
		t.Setenv(vlink.EnvShm, "maybe")
		_, err := (&vlink.Dialer{Stack: vlink.MustParse("identity")}).DialContext(ctx, "tcp", tl.Addr().String())
		var oe *net.OpError
		if !errors.As(err, &oe) {
			t.Fatalf("dial with VLINK_SHM=maybe: %v, want an error", err)
		}
	})
}

// TestShmConfig: the config file's shm key, under VLINK_SHM.
func TestShmConfig(t *testing.T) {
	ctx := context.Background()
	tl := listenBoth(t, vlink.ListenConfig{})
	dir := t.TempDir()
	for _, tc := range []struct{ file, env, want string }{
		{"shm = \"off\"\n", "", "tcp"},
		{"shm = \"off\"\n", "auto", "shm"},
		{"", "", "shm"},
		{"shm = \"sometimes\"\n", "", ""},
	} {
		t.Run(tc.file+"/"+tc.env, func(t *testing.T) {
			path := filepath.Join(dir, "c.toml")
			if err := os.WriteFile(path, []byte(tc.file+"[default]\nstack = \"identity\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := vlink.LoadConfig(path)
			if tc.want == "" {
				if err == nil {
					t.Fatal("the config loaded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv(vlink.EnvShm, tc.env)
			c, err := (&vlink.Dialer{Config: cfg}).DialContext(ctx, "tcp", tl.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if got, err := io.ReadAll(c); err != nil || string(got) != tc.want {
				t.Errorf("the listener on %q answered, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestListenShm: a ListenConfig with Shm takes TCP and shared-memory
// connections on one port number, under one policy.
func TestListenShm(t *testing.T) {
	ctx := context.Background()
	l := listenBoth(t, vlink.ListenConfig{Policy: vlink.Policy{Key: key}})
	for _, tc := range []struct {
		shm  vlink.ShmMode
		key  []byte
		want string
	}{
		{vlink.ShmAuto, key, "shm"},
		{vlink.ShmOff, key, "tcp"},
		{vlink.ShmAuto, []byte("not the listener's key, not at all"), ""},
	} {
		d := &vlink.Dialer{Stack: vlink.MustParse("identity"), Key: tc.key, Shm: tc.shm}
		c, err := d.DialContext(ctx, "tcp", l.Addr().String())
		if tc.want == "" {
			if err == nil {
				c.Close()
				t.Errorf("%s, wrong key: the dial succeeded", tc.shm)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.shm, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: the listener on %q answered, %v; want %q", tc.shm, got, err, tc.want)
		}
	}
	if _, err := (&vlink.ListenConfig{Shm: true, Stack: vlink.MustParse("shm")}).Listen(ctx, "tcp", "127.0.0.1:0"); !errors.Is(err, vlink.ErrBadStack) {
		t.Errorf("Shm beside the shm factory: %v, want ErrBadStack", err)
	}
}

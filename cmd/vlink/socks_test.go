package main

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/vlink"
)

// TestSocks runs vlink socks with a plain stack and reaches a backend
// through it with each SOCKS version, by address and by name.
func TestSocks(t *testing.T) {
	be := newBackend(t)
	srv := start(t, "socks", "--listen", "127.0.0.1:0", "--stack", "tcp", "--log-level", "debug")
	addr := srv.addr(t)
	_, port, _ := net.SplitHostPort(be.addr())
	for _, tc := range []struct{ layer, dest string }{
		{"socks5", be.addr()},
		{"socks5", "localhost:" + port},
		{"socks4a", "localhost:" + port},
		{"socks4", be.addr()},
	} {
		be.handlers <- func(c net.Conn) { io.Copy(c, c) }
		d := vlink.Dialer{Stack: vlink.MustParse(tc.layer + ":addr=" + addr), Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", tc.dest)
		if err != nil {
			t.Fatalf("%s to %s: %v", tc.layer, tc.dest, err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "hello")
		b := make([]byte, 5)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "hello" {
			t.Fatalf("%s: echo %q, %v", tc.layer, b, err)
		}
		c.Close()
	}
	srv.stderr.waitFor(t, `msg=connection .*socks=socks4a dest=localhost:`+port)
	if code := srv.stop(t); code != base.ExitOK {
		t.Fatalf("exit code %d", code)
	}
}

func TestSocksAuth(t *testing.T) {
	be := newBackend(t)
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	srv := start(t, "socks", "--listen", "127.0.0.1:0", "--stack", "tcp", "--user", "alice", "--password-file", pw)
	addr := srv.addr(t)
	t.Setenv("VLINK_TEST_SOCKS_PW", "s3cret")
	be.handlers <- func(c net.Conn) { io.WriteString(c, "ok") }
	d := vlink.Dialer{Stack: vlink.MustParse("socks5:user=alice,password-env=VLINK_TEST_SOCKS_PW,addr=" + addr)}
	c, err := d.Dial("tcp", be.addr())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "ok" {
		t.Fatalf("got %q", b)
	}
	d = vlink.Dialer{Stack: vlink.MustParse("socks5:addr=" + addr)}
	if _, err := d.Dial("tcp", be.addr()); !errors.Is(err, socks.ErrAuth) {
		t.Fatalf("no credentials: %v, want ErrAuth", err)
	}
	srv.stderr.waitFor(t, `msg="client refused"`)
	if strings.Contains(srv.stderr.String(), "s3cret") {
		t.Fatal("the log shows the password")
	}
}

func TestSocksUsage(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("x\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--allow-from", "not-a-cidr"}, base.ExitUsage, "CIDR"},
		{[]string{"--stack", "zstd"}, base.ExitUsage, "--via"},
		{[]string{"--stack", "tcp", "--config", "x.toml"}, base.ExitUsage, "not both"},
		{[]string{"--user", "a"}, base.ExitUsage, "--password-file"},
		{[]string{"--user", "a", "--password-file", pw}, base.ExitFailure, "chmod 600"},
		{[]string{"--via", "127.0.0.1:1"}, base.ExitUsage, "need --stack"},
		{[]string{"--stack", "socks5"}, base.ExitUsage, "missing required parameter addr"},
	} {
		code, _, stderr := runSync(append([]string{"socks", "--listen", "127.0.0.1:0"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.says) {
			t.Errorf("vlink socks %v: exit %d, stderr %q; want %d saying %q", tc.args, code, stderr, tc.code, tc.says)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

func TestKeyCommand(t *testing.T) {
	dir := t.TempDir()
	network := filepath.Join(dir, "network.key")
	if code, _, stderr := runSync("key", "--out", network); code != base.ExitOK {
		t.Fatalf("key --out: exit %d\n%s", code, stderr)
	}
	if fi, err := os.Stat(network); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("network key file: %v, %v", fi, err)
	}
	nk, err := vlink.ReadKeyFile(network)
	if raw, derr := base64.StdEncoding.DecodeString(string(nk)); err != nil || derr != nil || len(raw) != 32 {
		t.Fatalf("the key made is %q (%v, %v), want 32 random bytes in base64", nk, err, derr)
	}
	code, stdout, _ := runSync("key")
	if code != base.ExitOK || len(stdout) != 45 || stdout == string(nk)+"\n" {
		t.Fatalf("key to stdout: exit %d, %q", code, stdout)
	}
	tests := []struct {
		name string
		args []string
		code int
		out  string // stdout wanted, if any
	}{
		{"node key", []string{"key", "--node", "db", "--key-file", network}, base.ExitOK, string(vlink.NodeKey(nk, "db")) + "\n"},
		{"bad name", []string{"key", "--node", "DB", "--key-file", network}, base.ExitUsage, ""},
		{"node without network key", []string{"key", "--node", "db"}, base.ExitUsage, ""},
		{"network key without node", []string{"key", "--key-file", network}, base.ExitUsage, ""},
		{"no overwrite", []string{"key", "--out", network}, base.ExitFailure, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runSync(tt.args...)
			if code != tt.code || (tt.out != "" && stdout != tt.out) {
				t.Fatalf("exit %d, stdout %q; want %d, %q\n%s", code, stdout, tt.code, tt.out, stderr)
			}
		})
	}
	if again, _ := vlink.ReadKeyFile(network); !bytes.Equal(again, nk) {
		t.Fatal("--out replaced an existing key file without --force")
	}
	if code, _, _ := runSync("key", "--out", network, "--force"); code != base.ExitOK {
		t.Fatal("--force did not replace the file")
	}
	if again, _ := vlink.ReadKeyFile(network); bytes.Equal(again, nk) {
		t.Fatal("--force left the old key")
	}
}

func TestRelayCommand(t *testing.T) {
	if code, _, stderr := runSync("relay"); code != base.ExitUsage {
		t.Fatalf("relay without --key-file: exit %d\n%s", code, stderr)
	}
	network := filepath.Join(t.TempDir(), "network.key")
	runSync("key", "--out", network)
	nk, _ := vlink.ReadKeyFile(network)
	r := start(t, "relay", "--listen", "127.0.0.1:0", "--key-file", network, "--metrics", "127.0.0.1:0")
	metricsAddr := r.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	addr := r.stderr.waitFor(t, `msg="relay listening" addr=(\S+)`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	join := func(name string, key []byte) (*control.Node, error) {
		return control.Connect(ctx, control.Config{Name: name, Key: key, Relays: []string{addr}})
	}
	a, err := join("a", vlink.NodeKey(nk, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := join("b", vlink.NodeKey(nk, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Handle(1, func(m *control.Message) { m.Reply(context.Background(), 2, append([]byte("re: "), m.Payload...)) })
	coop := a.Cooperate(control.Expect{From: "b", Type: 2})
	coop.Send(ctx, "b", 1, []byte("hi"))
	replies, err := coop.Wait(ctx)
	if err != nil || string(replies[0].Payload) != "re: hi" {
		t.Fatalf("through the relay: %v, %v", replies, err)
	}
	if _, err := join("c", vlink.NodeKey(nk, "a")); !errors.Is(err, vlink.ErrRefused) {
		t.Fatalf("a node with another's key: %v, want refused", err)
	}
	// Failed logins are logged, with the reason, and counted.
	r.stderr.waitFor(t, `msg="vlink: refused" remote=127\.0\.0\.1:\d+ code="authentication failed" reason="the proof does not match the key of node \\"c\\"`)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Write([]byte("SSH-2.0-scanner\r\n"))
		io.Copy(io.Discard, c)
		c.Close()
	}
	testnet.WaitMetrics(t, "relay", metricsAddr, map[string]float64{
		`vlink_relay_failed_logins_total{reason="authentication_failed"}`: 1,
		`vlink_relay_failed_logins_total{reason="not_encrypted"}`:         1,
		`vlink_relay_registrations_total`:                                 2,
	})
	if code := r.stop(t); code != base.ExitOK {
		t.Fatalf("relay exit %d after SIGINT\n%s", code, r.stderr.String())
	}
}

package vlink_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
)

func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigRoutes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "k", string(key)+"\n", 0o600)
	path := writeFile(t, dir, "config.toml", `
key_file = "k"

[default]
stack = "test-xor"
via = "gw.example:7000"

[[route]]
host = "*.corp.example"
ports = "443"
layers = [{layer = "test-xor", params = {key = 3}}, {layer = "tcp"}]

[[route]]
host = "10.0.0.0/8"
action = "refuse"

[[route]]
host = "localhost"
action = "direct"
`, 0o644)
	cfg, err := vlink.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg.Key) != string(key) {
		t.Fatalf("key = %q", cfg.Key)
	}
	for _, want := range []string{"*.corp.example", "10.0.0.0/8", "refuse", "test-xor"} {
		if !strings.Contains(cfg.String(), want) {
			t.Errorf("config listing lacks %q:\n%s", want, cfg)
		}
	}
	d := vlink.Dialer{Config: cfg}
	if _, err := d.Dial("tcp", "10.1.2.3:22"); !errors.Is(err, vlink.ErrDirectRefused) {
		t.Fatalf("refused route: %v", err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, content, mention string }{
		{"unknown key", "[[route]]\nhots = \"x\"\n", "hots"},
		{"bad stack", "[[route]]\nhost = \"x\"\nstack = \"test-xor:key=999\"\n", "route 1"},
		{"bad rule", "[[route]]\nhost = \"10.0.0.0/99\"\nstack = \"test-xor\"\n", "rule 1"},
		{"both forms", "[[route]]\nstack = \"tcp\"\nlayers = [{layer = \"tcp\"}]\n", "not both"},
		{"open key", "key_file = \"k2\"\n", "chmod 600"},
	}
	writeFile(t, dir, "k2", string(key), 0o644)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, dir, "c.toml", tt.content, 0o644)
			if _, err := vlink.LoadConfig(p); err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("LoadConfig = %v, want an error mentioning %q", err, tt.mention)
			}
		})
	}
}

func TestConfigFromEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	t.Setenv(vlink.EnvConfig, "")
	os.Unsetenv(vlink.EnvConfig)
	cfg, err := vlink.ConfigFromEnv()
	if err != nil || cfg.String() != "default: direct" {
		t.Fatalf("no config at all = %v, %v; want direct", cfg, err)
	}
	t.Setenv(vlink.EnvStack, "test-xor")
	t.Setenv(vlink.EnvVia, "gw:7000")
	cfg, err = vlink.ConfigFromEnv()
	if err != nil || !strings.Contains(cfg.String(), "test-xor") {
		t.Fatalf("VLINK_STACK config = %v, %v", cfg, err)
	}
	t.Setenv(vlink.EnvStack, "bogus")
	if _, err := vlink.ConfigFromEnv(); !errors.Is(err, vlink.ErrUnknownLayer) {
		t.Fatalf("bad VLINK_STACK = %v, want ErrUnknownLayer", err)
	}
	t.Setenv(vlink.EnvStack, "")
	t.Setenv(vlink.EnvConfig, filepath.Join(dir, "missing.toml"))
	if _, err := vlink.ConfigFromEnv(); err == nil {
		t.Fatal("an explicit VLINK_CONFIG that does not exist must be an error")
	}
}

// TestConfigDigest: reading the same files again gives the same digest;
// an edit of the config file, or of its key file, or another VLINK_STACK
// gives another.
func TestConfigDigest(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "k", "0123456789abcdef0123456789abcdef\n", 0o600)
	path := writeFile(t, dir, "config.toml", "key_file = \"k\"\n[default]\nstack = \"zstd\"\n", 0o600)
	t.Setenv(vlink.EnvConfig, path)
	digest := func() [32]byte {
		t.Helper()
		c, err := vlink.ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		return c.Digest()
	}
	first := digest()
	if first == [32]byte{} || digest() != first {
		t.Fatalf("the same files read twice: %x, then %x", first, digest())
	}
	seen := map[[32]byte]string{first: "the first"}
	for _, change := range []struct {
		name string
		do   func()
	}{
		{"the config edited", func() { writeFile(t, dir, "config.toml", "key_file = \"k\"\n[default]\nstack = \"lz4\"\n", 0o600) }},
		{"its key file rewritten", func() { writeFile(t, dir, "k", "another key of sixteen bytes or more\n", 0o600) }},
		{"VLINK_STACK set", func() { t.Setenv(vlink.EnvStack, "zstd") }},
	} {
		change.do()
		d := digest()
		if was, ok := seen[d]; ok {
			t.Errorf("%s: the digest is %s's", change.name, was)
		}
		seen[d] = change.name
	}
	if c, err := vlink.LoadConfig(path); err != nil || c.Digest() == [32]byte{} {
		t.Errorf("LoadConfig: %v, digest %x", err, c.Digest())
	}
}

package dial

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/forward"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// loadTunnels loads a --forwards file for vlink tunnel.
func loadTunnels(t *testing.T, text string) ([]forward.Entry, string, error) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "tunnels.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var logb bytes.Buffer
	e := &base.Env{Log: slog.New(slog.NewTextHandler(&logb, nil))}
	entries, err := forward.Load(path, e, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
		o := &tunnelOptions{}
		o.flags(fs)
		return o.prepare
	})
	return entries, dir, err
}

func TestLoadForwardsRefuses(t *testing.T) {
	const ok = "[[forward]]\nlisten = \"127.0.0.1:9001\"\nto = \"127.0.0.1:1\"\nstack = \"tcp\"\n"
	for _, tc := range []struct{ name, file, want string }{
		{"syntax", "[[forward]]\nto = \n", "tunnels.toml:2:"},
		{"top-level key", "stack = \"tcp\"\n" + ok, "only [[forward]] tables belong in the file"},
		{"empty", "", "no [[forward]] table"},
		{"both ways at once", ok + "dial_time-out = \"1s\"\n", `unknown key "dial_time-out": did you mean dial_timeout?`},
		{"misspelt", ok + "dialtimeout = \"1s\"\n", `unknown key "dialtimeout": did you mean dial_timeout?`},
		{"unknown", ok + "colour = \"red\"\n", `unknown key "colour": the keys are name and the flags of one forward, with underscores: cert, cert_key, dial_timeout,`},
		{"process-wide", ok + "metrics = \"127.0.0.1:9464\"\n", "metrics applies to the whole process"},
		{"bool as string", ok + "insecure_plaintext = \"yes\"\n", `insecure_plaintext = "yes": want true or false, unquoted`},
		{"string as bool", ok + "via = true\n", "via = true: want a string"},
		{"duration as number", ok + "dial_timeout = 10\n", `dial_timeout = 10: want a string (a duration is written "10s")`},
		{"list for one value", ok + "via = [\"a:1\"]\n", "via takes one value, not a list"},
		{"bad value", ok + "dial_timeout = \"soon\"\n", `dial_timeout = "soon": time: invalid duration "soon"`},
		{"the command's check", "[[forward]]\nlisten = \"127.0.0.1:9001\"\n", "forward 1 (127.0.0.1:9001): --to HOST:PORT is required"},
		{"same port", ok + ok, "forward 2: forward 1 listens on 127.0.0.1:9001 already"},
		{"same name", "[[forward]]\nname = \"a\"\nstack = \"tcp\"\nto = \"h:1\"\nlisten = \"127.0.0.1:0\"\n[[forward]]\nname = \"a\"\nstack = \"tcp\"\nto = \"h:2\"\nlisten = \"127.0.0.1:0\"\n", `forward 1 has the same name, "a"`},
		{"same forward", "[[forward]]\nstack = \"tcp\"\nto = \"h:1\"\nlisten = \"127.0.0.1:0\"\n[[forward]]\nstack = \"tcp\"\nto = \"h:1\"\nlisten = \"127.0.0.1:0\"\n", "forward 2: the same forward as forward 1"},
		{"missing key file", strings.Replace(ok, `"tcp"`, `"zstd"`, 1) + "key_file = \"nokey\"\n", "nokey: no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := loadTunnels(t, tc.file)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestLoadForwards checks what a good file gives: the flags' values,
// FILE values in the file's folder, names, and ids that change with the
// settings and the key files' content but not with writing a default
// out or reordering keys; the dashed keys of old give the same, with a
// warning.
func TestLoadForwards(t *testing.T) {
	file := `
[[forward]]
name = "db"
listen = "127.0.0.1:0"
to = "db.example:5432"
stack = "zstd"
key_file = "k"
known_nodes = "none"

[[forward]]
to = "web.example:443"
listen = "127.0.0.1:9002"
stack = "tcp"
`
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	os.WriteFile(key, []byte("0123456789abcdef0123"), 0o600)
	load := func(text string) []forward.Entry {
		t.Helper()
		path := filepath.Join(dir, "f.toml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		var logb bytes.Buffer
		entries, err := forward.Load(path, &base.Env{Log: slog.New(slog.NewTextHandler(&logb, nil))}, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
			o := &tunnelOptions{}
			o.flags(fs)
			return o.prepare
		})
		if err != nil {
			t.Fatal(err)
		}
		return entries
	}
	first := load(file)
	if len(first) != 2 || first[0].Name != "db" || first[1].Name != "127.0.0.1:9002" {
		t.Fatalf("names: %+v", first)
	}
	db := first[0].F.(*tunnelForward)
	if db.o.keyFile != key || db.o.knownNodes != "none" || db.o.to != "db.example:5432" {
		t.Errorf("key-file %q, known-nodes %q, to %q: want %q, none, db.example:5432", db.o.keyFile, db.o.knownNodes, db.o.to, key)
	}
	if string(db.d.Key) != "0123456789abcdef0123" {
		t.Errorf("key %q", db.d.Key)
	}
	same := load(strings.Replace(file, `stack = "tcp"`, "dial_timeout = \"10s\"\nstack = \"tcp\"", 1))
	if same[0].Id != first[0].Id || same[1].Id != first[1].Id {
		t.Errorf("writing a default out changed an id")
	}
	changed := load(strings.Replace(file, `stack = "zstd"`, `stack = "lz4"`, 1))
	if changed[0].Id == first[0].Id || changed[1].Id != first[1].Id {
		t.Errorf("changing the first forward's stack: want its id changed and only its")
	}
	// The dashed keys of old: the same forwards, and a warning naming
	// the keys to write.
	var logb bytes.Buffer
	path := filepath.Join(dir, "old.toml")
	os.WriteFile(path, []byte(strings.NewReplacer("key_file", "key-file", "known_nodes", "known-nodes").Replace(file)), 0o600)
	old, err := forward.Load(path, &base.Env{Log: slog.New(slog.NewTextHandler(&logb, nil))}, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
		o := &tunnelOptions{}
		o.flags(fs)
		return o.prepare
	})
	if err != nil || len(old) != 2 || old[0].Id != first[0].Id {
		t.Errorf("the dashed keys: %v; want the same forwards", err)
	}
	if !strings.Contains(logb.String(), `level=WARN msg="the forwards file's keys are written with underscores now`) || !strings.Contains(logb.String(), `write="key_file, known_nodes"`) {
		t.Errorf("the dashed keys: want a warning naming key_file and known_nodes; the log:\n%s", logb.String())
	}
	os.WriteFile(key, []byte("another key, 16 bytes or more"), 0o600)
	rekeyed := load(file)
	if rekeyed[0].Id == first[0].Id || rekeyed[1].Id != first[1].Id {
		t.Errorf("a new key in the first forward's key file: want its id changed and only its")
	}
}

// failing is a forward whose listener fails for good when fail is closed,
// as a listener on another host's side can.
type failing struct {
	listen string
	fail   chan struct{}
}

func (f *failing) ListenAddr() string { return f.listen }
func (f *failing) Inputs() [][]byte   { return nil }
func (f *failing) Start(context.Context, *base.Env, *forward.Tracker) (net.Listener, func(net.Conn), func(), error) {
	return &failingListener{f: f, closed: make(chan struct{})}, func(c net.Conn) { c.Close() }, func() {}, nil
}

type failingListener struct {
	f      *failing
	once   sync.Once
	closed chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case <-l.f.fail:
		return nil, errors.New("the far side's listener is gone")
	case <-l.closed:
		return nil, net.ErrClosed
	}
}
func (l *failingListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{} }

// TestForwardsFail runs a file of two forwards whose listeners fail: the
// first to fail is logged, with what to do, and the process runs on; the
// second ends it with an error naming the cause.
func TestForwardsFail(t *testing.T) {
	fails := map[string]chan struct{}{"a:1": make(chan struct{}), "b:1": make(chan struct{})}
	path := filepath.Join(t.TempDir(), "f.toml")
	os.WriteFile(path, []byte("[[forward]]\nlisten = \"a:1\"\n[[forward]]\nlisten = \"b:1\"\n"), 0o600)
	var logb testnet.Buffer
	e := &base.Env{Log: slog.New(slog.NewTextHandler(&logb, nil))}
	p := &forward.ProcessOptions{Forwards: path}
	done := make(chan error, 1)
	go func() {
		done <- p.RunFile(context.Background(), e, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
			listen := fs.String("listen", "", "")
			return func(*base.Env) (forward.Forward, error) { return &failing{listen: *listen, fail: fails[*listen]}, nil }
		})
	}()
	waitLog := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logb.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", want, logb.String())
			}
		}
	}
	waitLog(`msg="running forwards"`)
	close(fails["a:1"])
	waitLog(`level=ERROR msg="forward stopped; SIGHUP starts it again" forward=a:1 err="accepting: the far side's listener is gone"`)
	select {
	case err := <-done:
		t.Fatalf("one forward of two failed, and the process ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(fails["b:1"])
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "every forward has stopped; the last: accepting: the far side's listener is gone") {
			t.Fatalf("got %v, want every forward stopped, with the cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("every forward failed, and the process runs on:\n%s", logb.String())
	}
}

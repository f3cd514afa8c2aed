package knownnodes

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

// TestCheck: first use pins, the same key passes, another key or none
// where one is pinned fails naming the line; no key and no pin passes
// without writing anything.
func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "known_nodes")
	f := New(path)
	var pinned int
	f.Pinned = func(string, []byte) { pinned++ }

	if err := f.Check("plain:7000", nil); err != nil {
		t.Fatalf("no key, no pin: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a listener without a key wrote the file: %v", err)
	}
	steps := []struct {
		addr string
		key  []byte
		line int // of the pin a KeyChangedError names; 0: passes
	}{
		{"a:7000", testKey(1), 0}, // pinned on line 1
		{"a:7000", testKey(1), 0},
		{"b:7000", testKey(2), 0}, // pinned on line 2
		{"a:7000", testKey(2), 1},
		{"b:7000", nil, 2},
		{"b:7000", testKey(2), 0},
		{"plain:7000", nil, 0},
	}
	for i, s := range steps {
		err := f.Check(s.addr, s.key)
		var kc *KeyChangedError
		switch {
		case s.line == 0 && err != nil:
			t.Fatalf("step %d: %v", i, err)
		case s.line != 0 && !errors.As(err, &kc):
			t.Fatalf("step %d: %v, want a KeyChangedError", i, err)
		case s.line != 0 && (kc.Line != s.line || kc.File != path || !errors.Is(err, ErrKeyChanged)):
			t.Fatalf("step %d: %+v", i, kc)
		}
	}
	if pinned != 2 {
		t.Errorf("Pinned called %d times, want 2", pinned)
	}
	// What a Dialer's first flight names (vlink.Dialer.PinnedKey).
	for addr, want := range map[string][]byte{"a:7000": testKey(1), "b:7000": testKey(2), "plain:7000": nil, "c:7000": nil} {
		if got := f.Key(addr); !bytes.Equal(got, want) {
			t.Errorf("Key(%s) = %x, want %x", addr, got, want)
		}
	}
	if got := New(filepath.Join(t.TempDir(), "none")).Key("a:7000"); got != nil {
		t.Errorf("Key of a file that does not exist = %x, want none", got)
	}
	data, _ := os.ReadFile(path)
	want := "a:7000 " + base64.StdEncoding.EncodeToString(testKey(1)) + "\nb:7000 " + base64.StdEncoding.EncodeToString(testKey(2)) + "\n"
	if string(data) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", data, want)
	}
	for _, p := range []string{path, filepath.Dir(path)} {
		fi, _ := os.Stat(p)
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s has mode %o: others may read or change the pins", p, perm)
		}
	}
	if err := f.Check("a:7000", []byte("short")); err == nil {
		t.Error("a key of the wrong size passed")
	}
}

// TestCheckConcurrent: dials checking at once pin a new node once.
func TestCheckConcurrent(t *testing.T) {
	f := New(filepath.Join(t.TempDir(), "known_nodes"))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if err := f.Check("a:1", testKey(7)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	data, _ := os.ReadFile(f.Path())
	if n := strings.Count(string(data), "\n"); n != 1 {
		t.Fatalf("%d lines pinned, want 1:\n%s", n, data)
	}
}

func TestParseErrors(t *testing.T) {
	good := base64.StdEncoding.EncodeToString(testKey(3))
	for _, tc := range []struct {
		name, data, mention string
	}{
		{"one field", "# pins\n\na:1\n", "3: want an address and a key, got 1 fields"},
		{"three fields", "a:1 " + good + " extra\n", "1: want an address and a key, got 3"},
		{"not base64", "a:1 ***\n", "1: the key of a:1 is not 32 bytes of base64"},
		{"short key", "a:1 " + base64.StdEncoding.EncodeToString([]byte("short")) + "\n", "not 32 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("Parse = %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
	f := New(filepath.Join(t.TempDir(), "known_nodes"))
	os.WriteFile(f.Path(), []byte("a:1 nonsense\n"), 0o600)
	if err := f.Check("a:1", testKey(1)); err == nil || !strings.Contains(err.Error(), f.Path()+":1:") {
		t.Fatalf("Check with a broken file: %v, want the file and line named", err)
	}
}

// FuzzParse: any file parses or fails without panicking; what parses has
// whole keys and addresses without spaces, and written back, parses the
// same.
func FuzzParse(f *testing.F) {
	f.Add([]byte("gw:7000 " + base64.StdEncoding.EncodeToString(testKey(1)) + "\n# c\n\n"))
	f.Add([]byte("a b c\n"))
	f.Add([]byte("a:1\t" + base64.StdEncoding.EncodeToString(testKey(2))))
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := Parse(data)
		if err != nil {
			return
		}
		var b bytes.Buffer
		for _, p := range pins {
			if len(p.Key) != KeySize || p.Address == "" || strings.ContainsAny(p.Address, " \t\n") {
				t.Fatalf("bad pin %+v", p)
			}
			b.WriteString(p.Address + " " + base64.StdEncoding.EncodeToString(p.Key) + "\n")
		}
		again, err := Parse(b.Bytes())
		if err != nil || len(again) != len(pins) {
			t.Fatalf("written back: %v, %d pins of %d", err, len(again), len(pins))
		}
		for i := range pins {
			if again[i].Address != pins[i].Address || !bytes.Equal(again[i].Key, pins[i].Key) {
				t.Fatalf("pin %d: %+v, then %+v", i, pins[i], again[i])
			}
		}
	})
}

// BenchmarkCheck: what pinning adds to a dial, for a file of 100 pins.
func BenchmarkCheck(b *testing.B) {
	f := New(filepath.Join(b.TempDir(), "known_nodes"))
	for i := range 100 {
		if err := f.Check(fmt.Sprintf("node%d.example:7000", i), testKey(byte(i))); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if err := f.Check("node99.example:7000", testKey(99)); err != nil {
			b.Fatal(err)
		}
	}
}

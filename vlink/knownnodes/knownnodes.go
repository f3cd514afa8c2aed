// Package knownnodes pins the static keys of vlink listeners in a file,
// as OpenSSH's known_hosts pins host keys: the first time a listener
// announces a key (vlink.Policy.Identity) its key is written down, and
// every later dial checks the key against that line, so a listener that
// holds the group's pre-shared key but not the pinned identity cannot pass
// for the one first met. File.Check is a vlink.PeerKeyCallback:
//
//	f := knownnodes.New(knownnodes.DefaultPath())
//	d := &vlink.Dialer{Stack: stack, Key: key, PeerKey: f.Check}
//
// The file holds one line per listener, its address as dialed and its
// public key in base64, and # comments:
//
//	gw.example.org:7000 GjO4oRzXq1Zb1tjXVzJ7h3xq8TuV0KMlQm7m2Yw9Wnc=
//
// A line is removed by hand when a listener's identity is replaced on
// purpose, as with ssh-keygen -R.
package knownnodes

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// KeySize is the size of a listener's public key (X25519).
const KeySize = 32

// maxFile bounds what Check reads: far beyond any real file, so a file
// that is not one (a device, a huge log) fails rather than eats memory.
const maxFile = 16 << 20

// DefaultPath is where the vlink command keeps its pins:
// $XDG_CONFIG_HOME/vlink/known_nodes, or ~/.config/vlink/known_nodes.
func DefaultPath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "vlink", "known_nodes")
}

// Fingerprint is how a key is shown to people: "SHA256:" and the
// unpadded base64 of the key's SHA-256, as OpenSSH shows its keys.
func Fingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// ErrKeyChanged is matched by a *KeyChangedError.
var ErrKeyChanged = errors.New("the node's key changed")

// A KeyChangedError is what Check returns when a listener announces a key
// other than the one pinned for its address, or none where one is pinned.
type KeyChangedError struct {
	Address   string
	Pinned    []byte // the key of the pinned line
	Presented []byte // the key the listener announced; nil for none
	File      string
	Line      int
}

func (e *KeyChangedError) Error() string {
	presented := "announced no key"
	if e.Presented != nil {
		presented = "announced the key " + Fingerprint(e.Presented)
	}
	return fmt.Sprintf("the vlink node at %s %s, but %s:%d pins %s: someone may be passing for it. "+
		"If its identity was replaced on purpose, delete that line", e.Address, presented, e.File, e.Line, Fingerprint(e.Pinned))
}

func (e *KeyChangedError) Is(target error) bool { return target == ErrKeyChanged }

// A File pins keys in the file at its path. Its methods are safe for
// concurrent use; the file is read on every check, so edits take effect
// at once.
type File struct {
	path string
	// Pinned, when set, is called after a key was pinned on first use,
	// so that a program can say so (as ssh's "Permanently added").
	Pinned func(address string, key []byte)

	mu sync.Mutex // one check or pin at a time within the process
}

// New returns the File at path; the file need not exist yet.
func New(path string) *File { return &File{path: path} }

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Check is a vlink.PeerKeyCallback. A listener that announces the key
// pinned for address passes; one whose address has no line passes too,
// and its key is pinned (appended to the file, created with mode 600 in
// a folder of mode 700 if need be); a different key, or none where one
// is pinned, fails with a *KeyChangedError. A listener with no key and
// no pin passes: it is authenticated by the pre-shared key alone.
func (f *File) Check(address string, key []byte) error {
	if key != nil && len(key) != KeySize {
		return fmt.Errorf("knownnodes: the node at %s announced a key of %d bytes, want %d", address, len(key), KeySize)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := readFile(f.path)
	if err != nil {
		return err
	}
	pins, err := Parse(data)
	if err != nil {
		return fmt.Errorf("knownnodes: %s:%w", f.path, err)
	}
	for _, p := range pins {
		if p.Address == address && !bytes.Equal(p.Key, key) {
			return &KeyChangedError{Address: address, Pinned: p.Key, Presented: key, File: f.path, Line: p.Line}
		}
	}
	for _, p := range pins {
		if p.Address == address {
			return nil
		}
	}
	if key == nil {
		return nil
	}
	if err := appendLine(f.path, address, key); err != nil {
		return err
	}
	if f.Pinned != nil {
		f.Pinned(address, key)
	}
	return nil
}

// Key returns the key pinned for address, nil for none, or if the file
// cannot be read or parsed (Check then says why): a vlink.Dialer's
// PinnedKey, so that its first flight to a listener pinned before names
// the key at once.
func (f *File) Key(address string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := readFile(f.path)
	if err != nil {
		return nil
	}
	pins, err := Parse(data)
	if err != nil {
		return nil
	}
	for _, p := range pins {
		if p.Address == address {
			return p.Key
		}
	}
	return nil
}

func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("knownnodes: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("knownnodes: %w", err)
	}
	if len(data) > maxFile {
		return nil, fmt.Errorf("knownnodes: %s is over %d bytes: not a known_nodes file", path, maxFile)
	}
	return data, nil
}

// appendLine pins key for address. One write of a whole line with
// O_APPEND: two processes pinning at once leave two whole lines.
func appendLine(path, address string, key []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("knownnodes: %w", err)
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("knownnodes: %w", err)
	}
	_, err = fh.Write([]byte(address + " " + base64.StdEncoding.EncodeToString(key) + "\n"))
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("knownnodes: pinning the key of %s: %w", address, err)
	}
	return nil
}

// A Pin is one line of the file.
type Pin struct {
	Address string // host:port as dialed
	Key     []byte
	Line    int // 1-based
}

// Parse reads a known_nodes file: blank lines, # comments, and lines of
// an address (no spaces) and a base64 key of KeySize bytes, separated by
// spaces or tabs. An error names the line and says what is wrong with it.
func Parse(data []byte) ([]Pin, error) {
	var pins []Pin
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%d: want an address and a key, got %d fields", n, len(fields))
		}
		key, err := base64.StdEncoding.Strict().DecodeString(fields[1])
		if err != nil || len(key) != KeySize {
			return nil, fmt.Errorf("%d: the key of %s is not %d bytes of base64", n, fields[0], KeySize)
		}
		pins = append(pins, Pin{Address: fields[0], Key: key, Line: n})
	}
	return pins, sc.Err()
}

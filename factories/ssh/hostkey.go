package ssh

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/vlink-dev/vlink/factories/internal/hop"
)

// HostKeyCheck says what to do with a host key that known_hosts does not
// hold. A key that differs from the one known_hosts holds is always
// refused.
type HostKeyCheck uint8

const (
	// Strict refuses unknown host keys, as StrictHostKeyChecking=yes.
	Strict HostKeyCheck = iota
	// AcceptNew records an unknown host key in the first known_hosts
	// file and goes on, as StrictHostKeyChecking=accept-new. A changed
	// key is still refused.
	AcceptNew
	// InsecureIgnoreHostKey checks nothing: anyone who can intercept
	// the connection can pose as the server and read everything.
	InsecureIgnoreHostKey
)

// Errors a *HostKeyError matches.
var (
	ErrHostKeyUnknown = errors.New("ssh: host key unknown")
	ErrHostKeyChanged = errors.New("ssh: HOST KEY CHANGED")
	ErrHostKeyRevoked = errors.New("ssh: host key revoked")
)

// A KnownKey is a key known_hosts holds for a host.
type KnownKey struct {
	File        string
	Line        int
	Type        string
	Fingerprint string // SHA256:...
}

func (k KnownKey) String() string {
	return fmt.Sprintf("%s:%d (%s %s)", k.File, k.Line, k.Type, k.Fingerprint)
}

// A HostKeyError is a host key refused: unknown, changed or revoked. It
// names the host, the key the server offered and, for a changed key, the
// keys known_hosts holds.
type HostKeyError struct {
	// Host is the host as checked: "name" for port 22, "[name]:port"
	// otherwise, as known_hosts writes it.
	Host string
	// KeyType and Fingerprint describe the key the server offered.
	KeyType     string
	Fingerprint string
	// Known are the keys known_hosts holds for Host (for a changed key).
	Known []KnownKey
	// Files are the known_hosts files that were read.
	Files []string
	// Err is ErrHostKeyUnknown, ErrHostKeyChanged or ErrHostKeyRevoked.
	Err error

	addr   string   // the server, host:port, for the commands the message suggests
	looked []string // every known_hosts file looked for, read or missing
	record string   // where a key is added: the first of looked
}

func (e *HostKeyError) Unwrap() error { return e.Err }

func (e *HostKeyError) Error() string {
	key := e.KeyType + " " + e.Fingerprint
	switch e.Err {
	case ErrHostKeyChanged:
		known := make([]string, len(e.Known))
		for i, k := range e.Known {
			known[i] = k.String()
		}
		return fmt.Sprintf("%v for %s: the server offers %s, but known_hosts holds %s. Someone may be intercepting the connection; "+
			"if the server's key really changed, remove the old one (ssh-keygen -R '%s') and connect again",
			e.Err, e.Host, key, strings.Join(known, ", "), e.Host)
	case ErrHostKeyRevoked:
		return fmt.Sprintf("%v: %s offers %s, which known_hosts marks @revoked", e.Err, e.Host, key)
	}
	var read string
	switch {
	case len(e.Files) > 0:
		read = "none of the known_hosts files read (" + strings.Join(e.Files, ", ") + ") holds it"
	case len(e.looked) > 0:
		read = "there is no known_hosts file to check it against (looked for " + strings.Join(e.looked, ", ") + ")"
	default:
		read = "there is no known_hosts file to check it against"
	}
	add := "add the key to known_hosts (ssh-keyscan prints it)"
	if e.record != "" && e.addr != "" {
		keyscan, login := "ssh-keyscan ", "ssh "
		host, port, err := net.SplitHostPort(e.addr)
		if err != nil {
			host, port = e.addr, "22"
		}
		if port != "22" {
			keyscan += "-p " + port + " "
			login += "-p " + port + " "
		}
		add = fmt.Sprintf("add the key to %s: %s%s >> %s (or log in once with %s%s and accept it)", e.record, keyscan, host, e.record, login, host)
	}
	return fmt.Sprintf("%v: %s offers %s, and %s. Check the fingerprint with the server's administrator, then %s, "+
		"or give the ssh layer host-key-check=accept-new to record it on first use", e.Err, e.Host, key, read, add)
}

// knownHostsMu serializes appends to known_hosts within the process.
var knownHostsMu sync.Mutex

// hostKeys checks host keys for one server against known_hosts.
type hostKeys struct {
	files  []string // existing files, read
	looked []string // the files given, or the defaults: existing or not
	record string   // where AcceptNew records: the first file given
	check  HostKeyCheck
	db     gossh.HostKeyCallback // nil when no file exists
}

func newHostKeys(files []string, check HostKeyCheck) (*hostKeys, error) {
	if len(files) == 0 {
		if home, err := os.UserHomeDir(); err == nil {
			files = append(files, filepath.Join(home, ".ssh", "known_hosts"))
		}
		files = append(files, "/etc/ssh/ssh_known_hosts")
	}
	h := &hostKeys{looked: files, record: files[0], check: check}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("known_hosts: %w", err)
		}
		h.files = append(h.files, f)
	}
	if len(h.files) > 0 && check != InsecureIgnoreHostKey {
		db, err := knownhosts.New(h.files...)
		if err != nil {
			return nil, fmt.Errorf("known_hosts: %w", err)
		}
		h.db = db
	}
	return h, nil
}

var probeKey = sync.OnceValue(func() gossh.PublicKey {
	k, _ := gossh.NewPublicKey(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))
	return k
})

// known returns the keys known_hosts holds for addr (host:port).
func (h *hostKeys) known(addr string) []knownhosts.KnownKey {
	if h.db == nil {
		return nil
	}
	var ke *knownhosts.KeyError
	if err := h.db(addr, hop.Addr{Net: "tcp", Host: addr}, probeKey()); errors.As(err, &ke) {
		return ke.Want
	}
	return nil
}

// algorithms orders the host key algorithms so that the server is asked
// first for the types known_hosts holds for it, as OpenSSH does; otherwise
// a server with several host keys could offer one we do not know and be
// refused as changed.
func (h *hostKeys) algorithms(addr string) []string {
	all := gossh.SupportedAlgorithms().HostKeys
	var first []string
	seen := map[string]bool{}
	add := func(a string) {
		if !seen[a] {
			seen[a] = true
			first = append(first, a)
		}
	}
	for _, k := range h.known(addr) {
		switch t := k.Key.Type(); t {
		case gossh.KeyAlgoRSA:
			add(gossh.KeyAlgoRSASHA512)
			add(gossh.KeyAlgoRSASHA256)
		default:
			for _, a := range all {
				if a == t {
					add(a)
				}
			}
		}
	}
	if len(first) == 0 {
		return nil // x/crypto's default order
	}
	for _, a := range all {
		add(a)
	}
	return first
}

// callback returns the HostKeyCallback for the handshake with addr.
func (h *hostKeys) callback(addr string) gossh.HostKeyCallback {
	return func(_ string, _ net.Addr, key gossh.PublicKey) error {
		if h.check == InsecureIgnoreHostKey {
			return nil
		}
		e := &HostKeyError{Host: knownhosts.Normalize(addr), KeyType: key.Type(), Fingerprint: gossh.FingerprintSHA256(key),
			Files: h.files, Err: ErrHostKeyUnknown, addr: addr, looked: h.looked, record: h.record}
		if h.db != nil {
			err := h.db(addr, hop.Addr{Net: "tcp", Host: addr}, key)
			var ke *knownhosts.KeyError
			var re *knownhosts.RevokedError
			switch {
			case err == nil:
				return nil
			case errors.As(err, &re):
				e.Err = ErrHostKeyRevoked
				return e
			case errors.As(err, &ke) && len(ke.Want) > 0:
				e.Err = ErrHostKeyChanged
				for _, k := range ke.Want {
					e.Known = append(e.Known, KnownKey{File: k.Filename, Line: k.Line, Type: k.Key.Type(),
						Fingerprint: gossh.FingerprintSHA256(k.Key)})
				}
				return e
			case errors.As(err, &ke):
			default:
				return fmt.Errorf("known_hosts: %w", err)
			}
		}
		if h.check != AcceptNew {
			return e
		}
		return h.add(addr, key)
	}
}

// add records key for addr in the first known_hosts file.
func (h *hostKeys) add(addr string, key gossh.PublicKey) error {
	knownHostsMu.Lock()
	defer knownHostsMu.Unlock()
	if err := os.MkdirAll(filepath.Dir(h.record), 0o700); err != nil {
		return fmt.Errorf("recording the host key: %w", err)
	}
	f, err := os.OpenFile(h.record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("recording the host key: %w", err)
	}
	_, err = f.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recording the host key: %w", err)
	}
	return nil
}

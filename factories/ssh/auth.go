package ssh

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"
)

// decrypted caches keys whose passphrase was asked for, by file, so that
// reconnecting does not ask again. It lives as long as the process.
var decrypted sync.Map // path -> gossh.Signer

// promptMu keeps two dials from asking on the terminal at once.
var promptMu sync.Mutex

// auth is one handshake's authentication: its methods, what it found on
// the way (for the error message), and what to close afterwards.
type auth struct {
	methods []gossh.AuthMethod
	notes   []string // keys skipped and why
	started atomic.Bool
	agent   net.Conn
}

func (a *auth) close() {
	if a.agent != nil {
		a.agent.Close()
	}
}

// newAuth gathers the signers of the agent and of the key files. Keys
// with a passphrase are decrypted only if the server accepts their public
// half, so the passphrase is asked for only when it is needed.
func (f *Factory) newAuth() (*auth, error) {
	a := &auth{}
	var signers []gossh.Signer
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" && !f.o.NoAgent {
		c, err := net.Dial("unix", sock)
		if err != nil {
			a.notes = append(a.notes, fmt.Sprintf("agent at SSH_AUTH_SOCK unreachable: %v", err))
		} else {
			a.agent = c
			ss, err := agent.NewClient(c).Signers()
			if err != nil {
				a.notes = append(a.notes, fmt.Sprintf("agent: %v", err))
			}
			signers = append(signers, ss...)
		}
	}
	for _, path := range f.t.identities {
		s, err := f.loadKey(path)
		switch {
		case err == nil:
			signers = append(signers, s)
		case f.t.defaultIdentities && errors.Is(err, fs.ErrNotExist):
		default:
			a.notes = append(a.notes, err.Error())
		}
	}
	a.methods = []gossh.AuthMethod{gossh.PublicKeysCallback(func() ([]gossh.Signer, error) {
		a.started.Store(true)
		return signers, nil
	})}
	return a, nil
}

// loadKey reads a private key file. An encrypted key becomes a signer
// that asks for its passphrase when first used.
func (f *Factory) loadKey(path string) (gossh.Signer, error) {
	if s, ok := decrypted.Load(path); ok {
		return s.(gossh.Signer), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	s, err := gossh.ParsePrivateKey(b)
	var pm *gossh.PassphraseMissingError
	switch {
	case err == nil:
		return s, nil
	case errors.As(err, &pm) && pm.PublicKey != nil:
		return &lockedKey{f: f, path: path, pem: b, pub: pm.PublicKey}, nil
	case errors.As(err, &pm):
		// No public half stored beside it: ask now, or never.
		return (&lockedKey{f: f, path: path, pem: b}).unlock()
	}
	return nil, fmt.Errorf("key %s: %w", path, err)
}

// lockedKey is a passphrase-protected key whose public half is known.
type lockedKey struct {
	f    *Factory
	path string
	pem  []byte
	pub  gossh.PublicKey
}

func (k *lockedKey) PublicKey() gossh.PublicKey { return k.pub }

func (k *lockedKey) Sign(rand io.Reader, data []byte) (*gossh.Signature, error) {
	s, err := k.unlock()
	if err != nil {
		return nil, err
	}
	return s.Sign(rand, data)
}

// unlock asks for the passphrase and decrypts the key, once per process.
func (k *lockedKey) unlock() (gossh.Signer, error) {
	promptMu.Lock()
	defer promptMu.Unlock()
	if s, ok := decrypted.Load(k.path); ok {
		return s.(gossh.Signer), nil
	}
	prompt := k.f.o.Prompt
	if prompt == nil {
		prompt = terminalPrompt
	}
	pass, err := prompt(fmt.Sprintf("Enter passphrase for key '%s': ", k.path))
	if err != nil {
		return nil, fmt.Errorf("key %s is encrypted and its passphrase cannot be asked for (%v): add it to the agent (ssh-add %s)", k.path, err, k.path)
	}
	s, err := gossh.ParsePrivateKeyWithPassphrase(k.pem, pass)
	clear(pass)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", k.path, err)
	}
	decrypted.Store(k.path, s)
	return s, nil
}

// errNoTerminal: there is no terminal to ask on.
var errNoTerminal = errors.New("no terminal")

// terminalPrompt asks on the controlling terminal with echo off, as ssh
// does; a program with no terminal (a service, CI) gets errNoTerminal.
func terminalPrompt(question string) ([]byte, error) {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil, errNoTerminal
	}
	defer tty.Close()
	if !term.IsTerminal(int(tty.Fd())) {
		return nil, errNoTerminal
	}
	fmt.Fprint(tty, question)
	pass, err := term.ReadPassword(int(tty.Fd()))
	fmt.Fprintln(tty)
	if err != nil {
		return nil, err
	}
	return pass, nil
}

// authError explains a failed authentication: what was tried and what
// was skipped.
func (a *auth) error(t target, err error) error {
	msg := fmt.Sprintf("%v as %s (%v)", ErrAuth, t.user, err)
	if len(a.notes) > 0 {
		msg += "; " + strings.Join(a.notes, "; ")
	}
	return &authError{msg: msg, err: err}
}

type authError struct {
	msg string
	err error
}

func (e *authError) Error() string   { return e.msg }
func (e *authError) Unwrap() []error { return []error{ErrAuth, e.err} }

var _ gossh.AlgorithmSigner = (*lockedKey)(nil)

// SignWithAlgorithm lets RSA keys sign with rsa-sha2-256/512, which
// servers require, rather than SHA-1.
func (k *lockedKey) SignWithAlgorithm(rand io.Reader, data []byte, algorithm string) (*gossh.Signature, error) {
	s, err := k.unlock()
	if err != nil {
		return nil, err
	}
	if as, ok := s.(gossh.AlgorithmSigner); ok {
		return as.SignWithAlgorithm(rand, data, algorithm)
	}
	return s.Sign(rand, data)
}

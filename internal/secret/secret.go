// Package secret reads the passwords that proxy layers need from places a
// stack can name without holding the secret itself: a file only its owner
// can read, or an environment variable; and other secrets from such files
// (ReadFile: vlink's key files, a network owner's key). Stacks are logged
// and printed, so a secret that does sit in a stack's text (a proxy URL's
// user-info, which users paste, or a password written by mistake) is
// redacted wherever the text is shown, well-formed or not (RedactStack,
// StackText).
package secret

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// MaxLen bounds a password read from a file; SOCKS5 allows 255 bytes, and
// an HTTP proxy has no business with more than this.
const MaxLen = 4096

// ErrNoPassword is matched when a layer has a user but no password source,
// or the source is empty.
var ErrNoPassword = errors.New("no password")

// ErrReadableByOthers is matched when a file holding a secret may be read
// by its group or by others: it is refused, as ssh refuses such key files,
// since the secret may already have leaked.
var ErrReadableByOthers = errors.New("readable by others")

// ReadFile reads a file holding a secret, trimmed of surrounding space; a
// file its group or others may read is refused (ErrReadableByOthers).
// what names the file in errors ("key file").
func ReadFile(path, what string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := ownerOnly(fi, path, what); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return bytes.TrimSpace(b), nil
}

// ownerOnly is the one rule for files holding secrets: no permission bits
// for group or others.
func ownerOnly(fi fs.FileInfo, path, what string) error {
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%s %s is %w (mode %v); run chmod 600 %s", what, path, ErrReadableByOthers, perm, path)
	}
	return nil
}

// Password returns inline (a proxy URL's password, given in the stack),
// or reads a password from file (one line; a trailing newline is not part
// of it) or from the environment variable env. At most one of them may
// be set; with none it returns "" and no error. A file
// readable by group or others is refused, as ssh refuses such key files.
func Password(inline, file, env string) (string, error) {
	given := 0
	for _, v := range []string{inline, file, env} {
		if v != "" {
			given++
		}
	}
	switch {
	case given > 1:
		return "", fmt.Errorf("give one of password-file, password-env or a proxy URL's password")
	case inline != "":
		return inline, nil
	case file != "":
		fi, err := os.Stat(file)
		if err != nil {
			return "", fmt.Errorf("password file: %w", err)
		}
		if err := ownerOnly(fi, file, "password file"); err != nil {
			return "", err
		}
		if fi.Size() > MaxLen {
			return "", fmt.Errorf("password file %s holds %d bytes, more than a password (%d at most)", file, fi.Size(), MaxLen)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("password file: %w", err)
		}
		pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pw == "" {
			return "", fmt.Errorf("%w: password file %s is empty", ErrNoPassword, file)
		}
		return pw, nil
	case env != "":
		pw, ok := os.LookupEnv(env)
		if !ok || pw == "" {
			return "", fmt.Errorf("%w: environment variable %s is unset or empty", ErrNoPassword, env)
		}
		return pw, nil
	}
	return "", nil
}

// Name reports whether a parameter named name says it holds a secret
// (password, secret, token, psk, key, and misspellings: pasword, pw,
// pwd, ...). It decides what HasPassword warns about; what is shown is
// decided by the layers' schemas (RedactStack). Names of places that
// hold a secret (password-file, password-env) and of checks
// (host-key-check) are not secrets.
func Name(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, "-file") || strings.HasSuffix(n, "-env") || strings.HasSuffix(n, "-check") {
		return false
	}
	for _, s := range []string{"pass", "pasw", "pwd", "secret", "token", "psk", "credential", "private"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	for _, w := range strings.FieldsFunc(n, func(r rune) bool { return r == '-' || r == '_' }) {
		if w == "pw" || w == "key" {
			return true
		}
	}
	return false
}

// Package secret reads the passwords that proxy layers need from places a
// stack can name without holding the secret itself: a file only its owner
// can read, or an environment variable. Stacks are logged and printed, so
// a password never sits in a stack's text.
package secret

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// MaxLen bounds a password read from a file; SOCKS5 allows 255 bytes, and
// an HTTP proxy has no business with more than this.
const MaxLen = 4096

// ErrNoPassword is matched when a layer has a user but no password source,
// or the source is empty.
var ErrNoPassword = errors.New("no password")

// Password reads a password from file (one line; a trailing newline is
// not part of it) or from the environment variable env. At most one of
// them may be set; with neither it returns "" and no error. A file
// readable by group or others is refused, as ssh refuses such key files.
func Password(file, env string) (string, error) {
	switch {
	case file != "" && env != "":
		return "", fmt.Errorf("give password-file or password-env, not both")
	case file != "":
		fi, err := os.Stat(file)
		if err != nil {
			return "", fmt.Errorf("password file: %w", err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("password file %s is readable by others (mode %v); run chmod 600 %s", file, fi.Mode().Perm(), file)
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

// Name reports whether a parameter named name may hold a secret itself
// (password, secret, token, psk, key, ...), so that its value is never
// printed: a user who wrote one in a stack by mistake must not see it
// echoed in an error or a log. Names of places that hold a secret
// (password-file, password-env) and of checks (host-key-check) are not.
func Name(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, "-file") || strings.HasSuffix(n, "-env") || strings.HasSuffix(n, "-check") {
		return false
	}
	for _, s := range []string{"pass", "secret", "token", "psk", "credential", "private"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return n == "key" || strings.HasSuffix(n, "-key") || strings.HasSuffix(n, "_key")
}

// Package secret reads the passwords that proxy layers need from places a
// stack can name without holding the secret itself: a file only its owner
// can read, or an environment variable. Stacks are logged and printed, so
// a password that does sit in a stack's text (a proxy URL's, which users
// paste) is redacted wherever the text is shown (RedactStack).
package secret

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// MaxLen bounds a password read from a file; SOCKS5 allows 255 bytes, and
// an HTTP proxy has no business with more than this.
const MaxLen = 4096

// ErrNoPassword is matched when a layer has a user but no password source,
// or the source is empty.
var ErrNoPassword = errors.New("no password")

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

// RedactStack returns a stack's text form, as given, well-formed or not,
// with the value of every parameter whose name says it is a secret (Name)
// and the password of every proxy URL (socks5h://user:password@host)
// replaced by REDACTED.
func RedactStack(text string) string {
	layers := strings.Split(text, "+")
	for i, l := range layers {
		if strings.Contains(l, "://") {
			layers[i] = redactURL(l)
			continue
		}
		name, params, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		kvs := strings.Split(params, ",")
		for j, kv := range kvs {
			if k, _, ok := strings.Cut(kv, "="); ok && Name(k) {
				kvs[j] = k + "=REDACTED"
			}
		}
		layers[i] = name + ":" + strings.Join(kvs, ",")
	}
	return strings.Join(layers, "+")
}

// redactURL is a proxy URL with its password redacted; one that does not
// parse keeps only its scheme, since where its password ends is unknown.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		scheme, _, _ := strings.Cut(s, "://")
		return scheme + "://REDACTED"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	}
	return u.String()
}

package layer

import (
	"errors"
	"time"
)

// Errors a layer wraps (with %w) so that a program matches them with
// errors.Is. Package vlink exports the same values under the same names
// (vlink.ErrAuth is ErrAuth), so a program never imports this package to
// test an error; a layer never imports vlink to make one.
var (
	// ErrAuth is matched when authentication is required, fails, or the
	// peer cannot prove it holds the key: a proxy or SSH server that
	// rejects the credentials, a listener that rejects the hello's proof.
	ErrAuth = errors.New("authentication failed")
	// ErrNotAllowed is matched when a policy forbids what was asked: a
	// proxy's ruleset, a listener's bounds on layers, parameters or
	// forwarding targets.
	ErrNotAllowed = errors.New("not allowed by policy")
	// ErrUnreachable is matched when a proxy, an SSH server or a
	// forwarding peer could not reach the target.
	ErrUnreachable = errors.New("target unreachable")
	// ErrDirectRefused is matched when the user's routing rules refuse a
	// destination: a layer that dials through a forward dialer of
	// package vlink may get it back, and passes it on (a SOCKS front
	// end answers "not allowed by ruleset").
	ErrDirectRefused = errors.New("destination refused by the routing rules")
)

// DefaultHandshakeTimeout bounds a handshake when neither the context nor
// the Dialer or ListenConfig sets a limit: a layer whose setup talks to
// a peer or a proxy uses it when its context has no deadline, so that a
// silent server cannot hold a dial forever. It is vlink's
// DefaultHandshakeTimeout.
const DefaultHandshakeTimeout = 10 * time.Second

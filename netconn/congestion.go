package netconn

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrCongestionControl is matched by the error of SetCongestionControl
// for an algorithm this system does not let the socket use: the kernel
// does not offer it, the process may not choose it, or the system has no
// per-socket choice (outside Linux).
var ErrCongestionControl = errors.New("congestion control not available")

// SetCongestionControl makes the TCP sender of c use the kernel's
// congestion control algorithm name ("bbr", "cubic", "reno", ...:
// TCP_CONGESTION). A listening socket's algorithm is its accepted
// connections'. The error for one the kernel does not offer, or does not
// let this process choose, matches ErrCongestionControl and names those
// it would take.
func SetCongestionControl(c syscall.Conn, name string) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return SetCongestionControlRaw(rc, name)
}

// ValidCongestionControl reports whether name can be the name of a
// congestion control algorithm: 1 to 15 letters, digits, '_' or '-' (the
// kernel's TCP_CA_NAME_MAX), so that a name from the network or a user
// is checked before it reaches the kernel or a log.
func ValidCongestionControl(name string) bool {
	if name == "" || len(name) > 15 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func congestionError(name string, err error, offered string) error {
	return fmt.Errorf("%w: %s: %w (%s)", ErrCongestionControl, name, err, offered)
}

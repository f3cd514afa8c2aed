//go:build !linux

package netconn

import (
	"errors"
	"syscall"
)

var errNoCongestion = errors.New("only Linux lets a socket choose its congestion control")

// SetCongestionControlRaw is SetCongestionControl for a socket not yet
// wrapped in a net.Conn; outside Linux it fails.
func SetCongestionControlRaw(_ syscall.RawConn, name string) error {
	return congestionError(name, errNoCongestion, "use the system's own")
}

// CongestionControl returns the congestion control algorithm of c's TCP
// sender; outside Linux it fails.
func CongestionControl(syscall.Conn) (string, error) { return "", errNoCongestion }

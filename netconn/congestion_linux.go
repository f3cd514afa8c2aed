package netconn

import (
	"errors"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetCongestionControlRaw is SetCongestionControl for a socket not yet
// wrapped in a net.Conn (a net.Dialer's or net.ListenConfig's Control).
func SetCongestionControlRaw(rc syscall.RawConn, name string) error {
	if !ValidCongestionControl(name) {
		return congestionError(name, errors.New("not a congestion control name"), offered())
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
	}); err != nil {
		return err
	}
	if serr != nil {
		return congestionError(name, serr, offered())
	}
	return nil
}

// CongestionControl returns the congestion control algorithm of c's TCP
// sender.
func CongestionControl(c syscall.Conn) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var name string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		return "", err
	}
	return name, gerr
}

// offered says which algorithms the kernel offers, and which of those an
// unprivileged process may choose.
func offered() string {
	read := func(f string) string {
		b, err := os.ReadFile("/proc/sys/net/ipv4/" + f)
		if err != nil {
			return "unknown"
		}
		return strings.TrimSpace(string(b))
	}
	return "this kernel offers: " + read("tcp_available_congestion_control") +
		"; a process without CAP_NET_ADMIN may choose: " + read("tcp_allowed_congestion_control")
}

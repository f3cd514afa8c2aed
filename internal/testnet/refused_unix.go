//go:build unix

package testnet

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// RefusedPort returns a loopback TCP port that refuses connections for
// the whole test. A port merely closed can be handed to another test's
// listener meanwhile; this one stays bound by a socket that does not
// listen, and without SO_REUSEADDR no listener can take it.
func RefusedPort(tb testing.TB) int {
	tb.Helper()
	_, port := boundSocket(tb)
	return port
}

// boundSocket returns a TCP socket bound to a port of 127.0.0.1 the
// kernel picked, closed when the test ends, and the port.
func boundSocket(tb testing.TB) (fd, port int) {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return fd, sa.(*syscall.SockaddrInet4).Port
}

// RefusedAddr is RefusedPort as a host:port.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(RefusedPort(tb)))
}

// UnansweredPort returns a port of 127.0.0.1 that a connect waits on
// until its timeout, for the whole test: a listener that never accepts,
// its queue full, so that the kernel drops further SYNs, as a host that
// drops them would.
func UnansweredPort(tb testing.TB) int {
	tb.Helper()
	fd, port := boundSocket(tb)
	if err := syscall.Listen(fd, 0); err != nil {
		tb.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for range 2 { // a backlog of 0 still queues one; fill it
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		tb.Cleanup(func() { c.Close() })
	}
	return port
}

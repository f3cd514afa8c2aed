//go:build unix

package testnet

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// RefusedPort returns a loopback TCP port that refuses connections for
// the whole test. A port merely closed can be handed to another test's
// listener meanwhile; this one stays bound by a socket that does not
// listen, and without SO_REUSEADDR no listener can take it.
func RefusedPort(tb testing.TB) int {
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
	return sa.(*syscall.SockaddrInet4).Port
}

// RefusedAddr is RefusedPort as a host:port.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(RefusedPort(tb)))
}

//go:build unix

package testnet

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestRefusedPort: the port refuses, and no listener can take it.
func TestRefusedPort(t *testing.T) {
	addr := RefusedAddr(t)
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, %v; want ECONNREFUSED", addr, c, err)
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("a listener took %s", addr)
	}
}

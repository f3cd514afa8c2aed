//go:build linux

package realserver

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePort: the ports are never the kernel's own picks (outside the
// ephemeral range), never the same twice, and each can then be bound for
// TCP and UDP, as the servers the tests start will.
func TestFreePort(t *testing.T) {
	lo, hi := ephemeralRange()
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p >= lo && p <= hi || p < 10000 || p > 65535 {
			t.Fatalf("port %d: in the ephemeral range %d-%d or out of bounds", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
		addr := net.JoinHostPort("0.0.0.0", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("port %d is not free for TCP: %v", p, err)
		}
		l.Close()
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			t.Fatalf("port %d is not free for UDP: %v", p, err)
		}
		pc.Close()
	}
	// A port someone holds is never given.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	if portFree(held) {
		t.Errorf("portFree(%d) = true while a listener holds it", held)
	}
}

//go:build linux

package integration

import (
	"fmt"
	"testing"
)

// TestShmTunnel carries streams of 0 B to 200 MiB, both ways with
// half-close, from a client through vlink tunnel, over shared memory,
// to vlink serve listening on shm, and on to socat's echo, checked by
// SHA-256; alone and under a filter.
func TestShmTunnel(t *testing.T) {
	_, echo := startSocatEcho(t)
	_, gw := startVLink(t, "serve", "--target", echo, "--listen-stack", "shm")
	for _, stack := range []string{"shm", "lz4+shm"} {
		t.Run(stack, func(t *testing.T) {
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			for i, n := range []int{0, 1, 1<<20 + 3, 200 << 20} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					checkEcho(t, tun, genData(n, uint64(20+i)))
				})
			}
		})
	}
}

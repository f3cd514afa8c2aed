//go:build linux

package integration

import (
	"fmt"
	"testing"
)

// TestShmTunnel carries streams of 0 B to 200 MiB, both ways with
// half-close, from a client through vlink tunnel, over shared memory,
// to vlink serve, and on to socat's echo, checked by SHA-256; alone and
// under a filter, to a serve listening on shm only and to one that
// takes shm beside its TCP port (--shm), which plain TCP tunnels still
// reach.
func TestShmTunnel(t *testing.T) {
	_, echo := startSocatEcho(t)
	_, only := startVLink(t, "serve", "--target", echo, "--listen-stack", "shm")
	_, both := startVLink(t, "serve", "--target", echo, "--shm")
	for _, tc := range []struct{ stack, gw string }{{"shm", only}, {"lz4+shm", only}, {"shm", both}, {"zstd", both}} {
		stack, gw := tc.stack, tc.gw
		name := stack + " to a shm listener"
		if gw == both {
			name = stack + " to serve --shm"
		}
		t.Run(name, func(t *testing.T) {
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			for i, n := range []int{0, 1, 1<<20 + 3, 200 << 20} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					checkEcho(t, tun, genData(n, uint64(20+i)))
				})
			}
		})
	}
}

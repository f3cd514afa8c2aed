//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestShmTunnel carries streams of 0 B to 200 MiB, both ways with
// half-close, from a client through vlink tunnel, over shared memory,
// to vlink serve, and on to socat's echo, checked by SHA-256:
//   - to a serve listening on shm only (--listen-stack shm), the
//     tunnel's stack ending in shm, alone and under a filter;
//   - to a serve that offers shm beside its TCP port (--shm), a tunnel
//     with a plain stack (zstd): it takes shm by itself (VLINK_SHM
//     unset: auto), or TCP with VLINK_SHM=off. serve's log tells which:
//     a shared-memory peer is "pid:N".
func TestShmTunnel(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	_, only := startVLink(t, "serve", "--target", echo, "--listen-stack", "shm")
	both, bothAddr := startVLink(t, "serve", "--target", echo, "--shm", "--log-level", "debug")
	for _, tc := range []struct {
		name, stack, gw, env, remote string
	}{
		{name: "shm to a shm listener", stack: "shm", gw: only},
		{name: "lz4+shm to a shm listener", stack: "lz4+shm", gw: only},
		{name: "zstd to serve --shm", stack: "zstd", gw: bothAddr, remote: `remote=pid:\d+ stack=zstd`},
		{name: "zstd to serve --shm, VLINK_SHM=off", stack: "zstd", gw: bothAddr, env: "off", remote: `remote=127\.0\.0\.1:\d+ stack=zstd`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("VLINK_SHM", tc.env)
			_, tun := startVLink(t, "tunnel", "--to", tc.gw, "--stack", tc.stack)
			before := 0
			if tc.remote != "" {
				before = len(regexp.MustCompile(tc.remote).FindAllString(both.Output(), -1))
			}
			sizes := []int{0, 1, 1<<20 + 3, 200 << 20}
			for i, n := range sizes {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					checkEcho(t, tun, genData(n, uint64(20+i)))
				})
			}
			if tc.remote != "" {
				// Each connection is logged when accepted and when forwarded.
				re := regexp.MustCompile(tc.remote)
				waitCount(t, both, re, before+2*len(sizes), startTimeout)
				if got := len(re.FindAllString(both.Output(), -1)); got < before+2*len(sizes) || strings.Count(both.Output(), "accepted") < len(sizes) {
					t.Errorf("serve logged %d lines matching %q, want %d:\n%s", got, tc.remote, before+2*len(sizes), both.Output())
				}
			}
		})
	}
}

// TestExecShm: an unmodified program under vlink exec, whose route goes
// through a vlink serve --shm on this machine, reaches it over shared
// memory by itself (the agent dials with a vlink.Dialer), and its bytes
// come back whole. The target must be beyond loopback, or vlink exec
// would leave the connection alone: one of this machine's own
// addresses.
func TestExecShm(t *testing.T) {
	testenv.Programs(t, "socat", "cc") // cc: vlink exec builds its shim
	ip := testenv.NonLoopbackIPv4(t)
	port := realserver.FreePort(t)
	target := net.JoinHostPort(ip.String(), strconv.Itoa(port))
	echo := startProc(t, "socat", "TCP-LISTEN:"+strconv.Itoa(port)+",bind="+ip.String()+",reuseaddr,fork", "EXEC:cat")
	echo.WaitListening(t, port)
	serve, gw := startVLink(t, "serve", "--allow", target, "--shm", "--log-level", "debug")
	data := genData(3<<20, 31)
	out, stderr, err := run(time.Minute, bytes.NewReader(data), vlinkBin, "exec", "--stack", "zstd", "--via", gw, "--",
		"socat", "-t5", "-", "TCP:"+target)
	if err != nil {
		t.Fatalf("vlink exec socat: %v\n%s", err, stderr)
	}
	if len(out) != len(data) || testnet.Sum(out) != testnet.Sum(data) {
		t.Fatalf("socat got %d bytes back, sent %d", len(out), len(data))
	}
	serve.WaitFor(t, regexp.MustCompile(`msg="connection closed" remote=pid:\d+ stack=zstd target=`+regexp.QuoteMeta(target)+` `), startTimeout)
}

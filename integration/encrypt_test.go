//go:build linux

package integration

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestEncryptedBeyondLoopback runs `vlink tunnel --stack zstd --key-file`
// to a `vlink serve --key-file` listening on this host's non-loopback
// address: the tunnel adds the noise layer by itself (serve logs the
// stack it accepted) and the bytes arrive intact; a tunnel told
// --insecure-plaintext is refused by serve, which says why.
func TestEncryptedBeyondLoopback(t *testing.T) {
	testenv.Programs(t, "socat")
	host := hostIPv4(t)
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, echo := startSocatEcho(t)
	serve := startProc(t, vlinkBin, "serve", "--listen", net.JoinHostPort(host, "0"), "--target", echo,
		"--key-file", keyFile, "--log-level", "debug", "--grace", "1s")
	serve.Name, serve.CleanExit = "vlink serve", true
	gw := serve.WaitFor(t, listenAddrRE, startTimeout)[1]
	serve.Ports = append(serve.Ports, realserver.Port(t, gw))

	_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd", "--key-file", keyFile)
	checkEcho(t, tun, testnet.RandomBytes(1<<20, 5))
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=zstd\+noise`), startTimeout)

	_, plain := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd", "--key-file", keyFile, "--insecure-plaintext")
	if got, err := exchange(t, plain, []byte("secret"), startTimeout); err == nil || len(got) != 0 {
		t.Errorf("a plaintext tunnel beyond loopback got %q, %v; want it refused", got, err)
	}
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: refused" .*encrypts what comes from beyond loopback`), startTimeout)
}

// hostIPv4 returns a non-loopback IPv4 address of this host.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	testenv.Missing(t, "a non-loopback IPv4 address on this host")
	return ""
}

//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
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

// TestIdentityPinned runs `vlink serve --identity` beyond loopback and a
// `vlink tunnel` that reaches it through its default encryption: the
// tunnel pins the identity `vlink key --identity` printed on first use
// and says so; when a serve with another identity (and the same key)
// takes the address, the tunnel refuses it, naming both fingerprints and
// the pinning line, and its client gets an error, not a clean end.
func TestIdentityPinned(t *testing.T) {
	testenv.Programs(t, "socat")
	host := hostIPv4(t)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fingerprintRE := regexp.MustCompile(`SHA256:[A-Za-z0-9+/]{43}`)
	var ids, fps [2]string
	for i := range ids {
		ids[i] = filepath.Join(dir, fmt.Sprintf("id%d", i))
		out, err := exec.Command(vlinkBin, "key", "--identity", "--out", ids[i]).CombinedOutput()
		if err != nil {
			t.Fatalf("vlink key --identity: %v: %s", err, out)
		}
		if fps[i] = fingerprintRE.FindString(string(out)); fps[i] == "" {
			t.Fatalf("vlink key --identity printed no fingerprint: %s", out)
		}
	}
	_, echo := startSocatEcho(t)
	gw := net.JoinHostPort(host, strconv.Itoa(realserver.FreePort(t)))
	serve := func(i int) *proc {
		p := startProc(t, vlinkBin, "serve", "--listen", gw, "--target", echo, "--key-file", keyFile, "--identity", ids[i], "--grace", "1s")
		p.Name, p.CleanExit = "vlink serve", true
		p.WaitFor(t, regexp.MustCompile(`msg=serving .*identity=`+regexp.QuoteMeta(fps[i])), startTimeout)
		p.Ports = append(p.Ports, realserver.Port(t, gw))
		return p
	}
	first := serve(0)
	knownNodes := filepath.Join(dir, "known_nodes")
	tunnel, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd", "--key-file", keyFile, "--known-nodes", knownNodes)
	checkEcho(t, tun, testnet.RandomBytes(1<<20, 7))
	tunnel.WaitFor(t, regexp.MustCompile(`msg="pinned the identity.*addr=`+regexp.QuoteMeta(gw)+` fingerprint=`+regexp.QuoteMeta(fps[0])), startTimeout)
	checkEcho(t, tun, []byte("again, the same identity"))
	first.Stop(t)

	serve(1)
	if got, err := exchange(t, tun, []byte("to an impostor"), startTimeout); err == nil {
		t.Fatalf("a tunnel to a listener with another identity got %q and a clean end; want an error", got)
	}
	tunnel.WaitFor(t, regexp.MustCompile(`announced the key `+regexp.QuoteMeta(fps[1])+`, but `+regexp.QuoteMeta(knownNodes)+`:1 pins `+regexp.QuoteMeta(fps[0])), startTimeout)
}

// TestExecEncryption runs `vlink exec --stack zstd --via GATEWAY
// --key-file` to a `vlink serve --key-file` beyond loopback: the
// program's bytes arrive through zstd+noise, which serve logs; with
// --insecure-plaintext the agent sends zstd as given, which serve
// refuses (the program's connect fails), and which a serve told
// --insecure-plaintext accepts.
func TestExecEncryption(t *testing.T) {
	testenv.Programs(t, "socat", "cc") // cc: vlink exec builds its shim
	host := hostIPv4(t)
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	echoPort := realserver.FreePort(t)
	echoAddr := net.JoinHostPort(host, strconv.Itoa(echoPort))
	echo := startProc(t, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=%s,reuseaddr,fork,backlog=128", echoPort, host), "EXEC:cat")
	echo.WaitListening(t, echoPort)
	for _, tc := range []struct {
		name       string
		execFlags  []string
		serveFlags []string
		accepted   string // the stack serve logs; "" for a refusal
	}{
		{"default", nil, nil, "zstd+noise"},
		{"plaintext refused", []string{"--insecure-plaintext"}, nil, ""},
		{"plaintext on both sides", []string{"--insecure-plaintext"}, []string{"--insecure-plaintext"}, "zstd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serve := startProc(t, vlinkBin, append([]string{"serve", "--listen", net.JoinHostPort(host, "0"), "--allow", echoAddr,
				"--key-file", keyFile, "--log-level", "debug", "--grace", "1s"}, tc.serveFlags...)...)
			serve.Name, serve.CleanExit = "vlink serve", true
			gw := serve.WaitFor(t, listenAddrRE, startTimeout)[1]
			serve.Ports = append(serve.Ports, realserver.Port(t, gw))
			args := append([]string{"exec", "--stack", "zstd", "--via", gw, "--key-file", keyFile}, tc.execFlags...)
			args = append(args, "--", "socat", "-t", "5", "-", "TCP:"+echoAddr)
			cmd := exec.Command(vlinkBin, args...)
			cmd.Stdin = strings.NewReader("through vlink exec\n")
			out, err := cmd.Output()
			if tc.accepted == "" {
				if err == nil && len(out) > 0 {
					t.Fatalf("a plaintext stack beyond loopback was carried: %q", out)
				}
				serve.WaitFor(t, regexp.MustCompile(`msg="vlink: refused" .*encrypts what comes from beyond loopback`), startTimeout)
				return
			}
			if err != nil || string(out) != "through vlink exec\n" {
				t.Fatalf("vlink exec socat: %q, %v", out, err)
			}
			serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=`+regexp.QuoteMeta(tc.accepted)+`( |$)`), startTimeout)
		})
	}
}

// TestEncryptedThroughProxy runs `vlink tunnel --stack identity+socks5`
// with a key to a `vlink serve --key-file` on loopback, through dante
// reached at this host's non-loopback address: serve sees the proxy's
// loopback address, so the tunnel must add the noise layer by itself
// (serve logs the stack it accepted), and the wire to the proxy carries
// no part of the payload in clear. A TCP forwarder in front of dante
// (which listens on loopback) records that wire.
func TestEncryptedThroughProxy(t *testing.T) {
	testenv.Programs(t, "socat")
	host := hostIPv4(t)
	dante := realserver.StartDante(t, false)
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, echo := startSocatEcho(t)
	serve, gw := startVLink(t, "serve", "--target", echo, "--key-file", keyFile, "--log-level", "debug")
	proxy, wire := recordingForwarder(t, host, dante.Addr)

	payload := testnet.RandomBytes(1<<20, 11)
	for _, stack := range []string{"identity+socks5:addr=" + proxy, "mux+socks5h://" + proxy} {
		_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack, "--key-file", keyFile)
		checkEcho(t, tun, payload)
	}
	if w := wire(); len(w) < len(payload) {
		t.Errorf("the forwarder saw %d bytes, fewer than the payload's %d", len(w), len(payload))
	} else if chunk := payload[1000:1064]; bytes.Contains(w, chunk) {
		t.Errorf("the wire to the proxy carries the payload in clear")
	}
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=identity\+noise( |$)`), startTimeout)
}

// recordingForwarder listens on host and forwards each connection to
// target, recording what clients send, each direction ending as its
// sender ends it. It returns its address and the recording so far.
func recordingForwarder(t *testing.T, host, target string) (string, func() []byte) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []byte
	)
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		defer c.Close()
		next, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer next.Close()
		up := make(chan struct{})
		go func() {
			defer close(up)
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				mu.Lock()
				got = append(got, buf[:n]...)
				mu.Unlock()
				if _, werr := next.Write(buf[:n]); err != nil || werr != nil {
					netconn.CloseWrite(next)
					return
				}
			}
		}()
		// Each direction ends on its own: the answer may still flow
		// after the target ended what it sends.
		io.Copy(c, next)
		netconn.CloseWrite(c)
		<-up
	})
	return l.Addr().String(), func() []byte { mu.Lock(); defer mu.Unlock(); return bytes.Clone(got) }
}

//go:build linux

package integration

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// quicPinRE matches the pin a QUIC listener logs.
var quicPinRE = regexp.MustCompile(`msg="vlink: taking QUIC" udp=\S+ pin=(SHA256:\S+)`)

// TestQuicTunnel carries streams of 0 B to 200 MiB, both ways with
// half-close, from a client through vlink tunnel, over QUIC, to vlink
// serve --quic, and on to socat's echo, checked by SHA-256: with the
// key (the hello's proofs bound to the QUIC connection), under a
// compressing filter, under parallel streams (its links are streams of
// one QUIC connection), and with the listener's pin too, which a wrong
// pin fails.
func TestQuicTunnel(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve, gw := startVLink(t, "serve", "--target", echo, "--quic", "--key-file", keyFile, "--log-level", "debug")
	pin := serve.WaitFor(t, quicPinRE, startTimeout)[1]
	for _, tc := range []struct{ name, stack string }{
		{"quic", "identity+quic"},
		{"zstd over quic", "zstd+quic"},
		{"parallel over quic", "parallel:streams=4+quic"},
		{"pinned", "lz4+quic:pin=" + pin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", tc.stack, "--key-file", keyFile)
			for i, n := range []int{0, 1, 1<<20 + 3, 200 << 20} {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					checkEcho(t, tun, genData(n, uint64(40+i)))
				})
			}
		})
	}
	// serve took them on QUIC: its peers' addresses are the UDP sockets
	// of the tunnels, which log nothing else.
	if !strings.Contains(serve.Output(), "stack=zstd") {
		t.Errorf("serve logged no zstd connection:\n%s", serve.Output())
	}
	t.Run("wrong pin", func(t *testing.T) {
		wrong := "SHA256:" + strings.Repeat("A", 43)
		tunnel, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "identity+quic:pin="+wrong, "--key-file", keyFile)
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("read %d bytes through a tunnel whose pin is wrong", n)
		}
		tunnel.WaitFor(t, regexp.MustCompile(`the listener's key does not match the pin`), startTimeout)
	})
}

// TestQuicBlackHole: a far site's firewall lets UDP to the gateway in;
// mid-download it starts dropping it, a path gone black. The client
// through vlink tunnel -> QUIC -> vlink serve gets an error within the
// QUIC idle timeout (3 s here, or three probe timeouts if longer), never
// a clean end of a short stream; and
// once the path is back, a new connection works.
func TestQuicBlackHole(t *testing.T) {
	testenv.Programs(t, "socat")
	site := newFarSite(t)
	nft := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", site.ns, "nft"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	port := fmt.Sprint(site.gatewayPort)
	nft("insert", "rule", "inet", "vlpre", "input", "udp", "dport", port, "accept")
	src := site.start(t, "socat", "TCP-LISTEN:9000,bind=127.0.0.1,reuseaddr,fork", "SYSTEM:exec cat /dev/zero")
	site.waitListening(t, src, 9000)
	serve := site.start(t, vlinkBin, "serve", "--listen", site.gateway(), "--listen-stack", "quic", "--target", "127.0.0.1:9000", "--grace", "1s")
	serve.WaitFor(t, quicPinRE, startTimeout)
	_, tun := startVLink(t, "tunnel", "--to", site.gateway(), "--stack", "quic:idle=3s")

	download := func() (int64, time.Duration, error) {
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, 8<<20)); err != nil {
			t.Fatalf("before the black hole: %v", err)
		}
		nft("insert", "rule", "inet", "vlpre", "input", "udp", "dport", port, "drop")
		start := time.Now()
		n, err := io.Copy(io.Discard, c)
		return n, time.Since(start), err
	}
	n, took, err := download()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("the client read %d more bytes, then nothing for 60 s: the black hole never ended the stream", n)
	case err == nil:
		t.Fatalf("the client read %d more bytes, then a clean end of stream: silently truncated", n)
	}
	t.Logf("the client read %d more bytes, then %v after %v", n, err, took)
	if took > 15*time.Second {
		// RFC 9000 §10.1: the idle timeout, or three probe timeouts if
		// longer (a bulk transfer fills the socket buffers, and the RTT
		// estimate grows: 7.5 s here).
		t.Errorf("the stream ended %v after the path went black, want within the idle timeout (3 s) or three probe timeouts", took)
	}

	// The path back: the drop rule is the first of the chain.
	out, _ := exec.Command("ip", "netns", "exec", site.ns, "nft", "-a", "list", "chain", "inet", "vlpre", "input").Output()
	m := regexp.MustCompile(`udp dport ` + port + ` drop # handle (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no drop rule to remove:\n%s", out)
	}
	nft("delete", "rule", "inet", "vlpre", "input", "handle", string(m[1]))
	c, err := net.Dial("tcp", tun)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1<<20)); err != nil {
		t.Fatalf("a new connection once the path is back: %v", err)
	}
}

// TestQuicEnds: over QUIC, vlink says what TCP would. A keyed serve that
// refuses a connection sending no hello resets it, and the tunnel's
// client reads a reset, not a clean end of an empty stream; and a serve
// killed with SIGKILL (nothing left to answer for it) is noticed by
// default within the idle timeout and a keepalive (8 s), as a reset.
func TestQuicEnds(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve, gw := startVLink(t, "serve", "--target", echo, "--quic", "--key-file", keyFile)
	serve.WaitFor(t, quicPinRE, startTimeout)

	t.Run("refused", func(t *testing.T) {
		_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "quic")
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		var got []byte
		if _, err = c.Write([]byte("no hello")); err == nil { // a reset before the write is the write's
			got, err = io.ReadAll(c)
		}
		if err == nil || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the tunnel's client read %q, %v: want a reset", got, err)
		}
	})

	t.Run("peer killed", func(t *testing.T) {
		_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "identity+quic", "--key-file", keyFile)
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		serve.Kill()
		<-serve.Done()
		killed := time.Now()
		_, err = io.ReadAll(c)
		took := time.Since(killed)
		t.Logf("the client's read ended %v after serve was killed: %v", took.Round(time.Millisecond), err)
		switch {
		case err == nil:
			t.Fatal("the client saw a clean end after serve was killed")
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.Fatal("the client saw nothing for a minute after serve was killed")
		case took > 12*time.Second:
			t.Errorf("the client learned %v after serve was killed, want within the idle timeout and a keepalive (6 + 2 s) and a little", took)
		}
	})
}

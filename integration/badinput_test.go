//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// The VLink handshake as it is on the wire (vlink/frame.go): the magic,
// then frames of version u8 | type u8 | length u16 | fields, each field
// tag u8 | length u16 | value. A black-box test writes the bytes itself.
const (
	wireMagic     = "\x89VLK\r\n\x1a\n"
	wireVersion   = 1
	wireHello     = 1
	wireAccept    = 4
	wireTagStack  = 1
	wireHeaderLen = 4
)

// helloFrame is the magic and a hello asking for stack, naming no target.
func helloFrame(stack string) []byte {
	b := []byte(wireMagic)
	b = append(b, wireVersion, wireHello)
	b = binary.BigEndian.AppendUint16(b, uint16(3+len(stack)))
	b = append(b, wireTagStack)
	b = binary.BigEndian.AppendUint16(b, uint16(len(stack)))
	return append(b, stack...)
}

// TestBadInputDuringTransfer feeds vlink serve garbage, truncated and
// oversized hellos, stalled handshakes and a corrupt compressed stream
// while a curl download runs through it: each bad connection must be
// closed within its bound and logged, the download must arrive intact,
// and serve must go on serving.
func TestBadInputDuringTransfer(t *testing.T) {
	testenv.Programs(t, "curl", "python3", "socat")
	const (
		// Generous bounds: CI machines are shared and loaded. prompt is
		// what bad input that can be judged at once may take; the
		// handshake timeout is what a stalled one takes.
		handshakeTimeout = 8 * time.Second
		prompt           = 4 * time.Second
		stalled          = 100 // under serve's bound on handshakes in progress
	)
	dir := t.TempDir()
	data := genData(50<<20, 5)
	small := genData(1<<20, 6)
	for name, b := range map[string][]byte{"data.bin": data, "small.bin": small} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	webServer, web := startHTTPServer(t, dir)
	serve, gw := startVLink(t, "serve", "--target", web, "--handshake-timeout", handshakeTimeout.String(), "--log-level", "debug")
	_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd")

	// The transfer in flight: curl, slowed so that it outlasts the bad
	// input (50 MiB at 3 MiB/s is about 17 s).
	out := filepath.Join(t.TempDir(), "got.bin")
	curlDone := make(chan error, 1)
	go func() {
		_, stderr, err := run(2*time.Minute, nil, "curl", "-sS", "--fail", "--limit-rate", "3M", "-o", out, "http://"+tun+"/data.bin")
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr)
		}
		curlDone <- err
	}()
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(out); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the download did not start")
		}
	}

	// loggedFailure waits for serve's record of the connection from
	// local failing (a refused or failed handshake, or a failed relay):
	// at level info or above, where an operator sees it by default.
	loggedFailure := func(t *testing.T, local net.Addr) {
		t.Helper()
		re := regexp.MustCompile(`level=(?:INFO|WARN|ERROR) [^\n]*remote=` + regexp.QuoteMeta(local.String()) + ` `)
		serve.WaitFor(t, re, 5*time.Second)
	}
	// send writes b on a new connection to serve, half-closes if asked,
	// and checks that serve closes the connection within limit.
	send := func(t *testing.T, b []byte, halfClose bool, limit time.Duration) net.Addr {
		t.Helper()
		c, err := net.Dial("tcp", gw)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetWriteDeadline(time.Now().Add(limit))
		// serve may hang up before it has read everything: that is fine.
		if _, err := c.Write(b); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatal(err)
		}
		if halfClose {
			c.(*net.TCPConn).CloseWrite()
		}
		if _, took, err := waitClosed(c, limit+2*time.Second); err != nil || took > limit {
			t.Fatalf("serve ended the connection after %v (%v), want within %v", took.Round(time.Millisecond), err, limit)
		}
		return c.LocalAddr()
	}

	t.Run("bad input", func(t *testing.T) {
		t.Run("random garbage with socat", func(t *testing.T) {
			t.Parallel()
			// Plain to serve: it relays the garbage to the web server,
			// which refuses it (a 4xx in its log) and hangs up; serve
			// then ends socat's connection. What socat's exit status says
			// depends on who closed first, so only its end is checked.
			const limit = 30 * time.Second
			start := time.Now()
			_, stderr, err := run(limit, bytes.NewReader(testnet.RandomBytes(1<<20, 1)), "socat", "-u", "-", "TCP:"+gw)
			if took := time.Since(start); took >= limit {
				t.Fatalf("socat was still connected after %v: serve did not end the relay (%v: %s)", took.Round(time.Second), err, stderr)
			}
			webServer.WaitFor(t, regexp.MustCompile(`code 4\d\d`), 10*time.Second)
		})
		t.Run("garbage after the magic", func(t *testing.T) {
			t.Parallel()
			loggedFailure(t, send(t, append([]byte(wireMagic), testnet.RandomBytes(64<<10, 2)...), false, prompt))
		})
		t.Run("oversized hello frame", func(t *testing.T) {
			t.Parallel()
			loggedFailure(t, send(t, []byte(wireMagic+"\x01\x01\xff\xff"), false, prompt))
		})
		t.Run("truncated hello then half-close", func(t *testing.T) {
			t.Parallel()
			loggedFailure(t, send(t, helloFrame("zstd")[:len(wireMagic)+6], true, prompt))
		})
		t.Run("truncated hello held open", func(t *testing.T) {
			t.Parallel()
			loggedFailure(t, send(t, helloFrame("zstd")[:len(wireMagic)+6], false, handshakeTimeout+prompt))
		})
		t.Run("unknown layer", func(t *testing.T) {
			t.Parallel()
			loggedFailure(t, send(t, helloFrame("nosuchlayer"), false, prompt))
		})
		t.Run(fmt.Sprintf("%d stalled handshakes", stalled), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			hello := helloFrame("zstd")
			conns := make([]net.Conn, stalled)
			for i := range conns {
				c, err := net.Dial("tcp", gw)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetWriteDeadline(time.Now().Add(time.Second))
				// The magic and a prefix of a hello, then silence (a strict
				// prefix of the magic alone is a plain client's, handed to
				// the target a sniff timeout after its last byte).
				c.Write(hello[:len(wireMagic)+1+i%6])
				conns[i] = c
			}
			// Meanwhile a new VLink connection is served.
			t.Logf("%d stalled handshakes opened in %v", stalled, time.Since(start).Round(time.Millisecond))
			got, stderr, err := run(30*time.Second, nil, "curl", "-sS", "--fail", "http://"+tun+"/small.bin")
			if err != nil || testnet.Sum(got) != testnet.Sum(small) {
				t.Errorf("curl during stalled handshakes: %v %s; got %d bytes sha256 %.16s, want %d bytes %.16s",
					err, stderr, len(got), testnet.Sum(got), len(small), testnet.Sum(small))
			}
			for _, c := range conns {
				if _, took, err := waitClosed(c, handshakeTimeout+prompt); err != nil || took > handshakeTimeout+prompt {
					t.Fatalf("a stalled handshake ended after %v (%v), want within %v", took, err, handshakeTimeout+prompt)
				}
			}
			t.Logf("serve closed them %v after the first was opened", time.Since(start).Round(time.Millisecond))
			for _, c := range conns {
				loggedFailure(t, c.LocalAddr())
			}
		})
		t.Run("corrupt stream after the handshake", func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", gw)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(helloFrame("zstd")); err != nil {
				t.Fatal(err)
			}
			var h [wireHeaderLen]byte
			if _, err := io.ReadFull(c, h[:]); err != nil {
				t.Fatalf("reading serve's answer: %v", err)
			}
			if h[1] != wireAccept {
				t.Fatalf("serve answered a zstd hello with frame type %d, want accept (%d)", h[1], wireAccept)
			}
			if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint16(h[2:]))); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(testnet.RandomBytes(64<<10, 3)); err != nil {
				t.Fatal(err)
			}
			if _, took, err := waitClosed(c, prompt+2*time.Second); err != nil || took > prompt {
				t.Fatalf("serve ended the corrupt stream after %v (%v), want within %v", took, err, prompt)
			}
			loggedFailure(t, c.LocalAddr())
		})
	})

	select {
	case err := <-curlDone:
		t.Errorf("the download ended (%v) before the bad input was over: the test proves nothing; slow it down", err)
	default:
	}
	if err := <-curlDone; err != nil {
		t.Fatalf("curl: %v", err)
	}
	got, n := fileSum(t, out)
	if n != int64(len(data)) || got != testnet.Sum(data) {
		t.Fatalf("curl saved %d bytes sha256 %.16s, the file has %d bytes sha256 %.16s", n, got, len(data), testnet.Sum(data))
	}
	// Still serving: a new connection.
	b, stderr, err := run(30*time.Second, nil, "curl", "-sS", "--fail", "http://"+tun+"/small.bin")
	if err != nil || testnet.Sum(b) != testnet.Sum(small) {
		t.Fatalf("curl after the bad input: %v %s; got %d bytes", err, stderr, len(b))
	}
}

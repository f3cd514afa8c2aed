//go:build linux

package integration

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// abortStacks are the stacks whose streams carry an end marker: through
// each, a stream cut short by a killed hop must reach the application as
// an error. The plain tcp stack has none (it is TCP byte for byte, as
// socat or ssh -L are): there a killed hop's FIN is all the next one
// sees, so it is tested only with the cuts that reset.
var abortStacks = []string{"zstd", "lz4", "s2", "deflate", "adaptive", "mux", "parallel", "noise", "shm", "quic:idle=3s"}

// A cut ends a hop of tunnel -> serve in the middle of a transfer.
type cut struct {
	name   string
	upload bool // the client sends and the target reads; else the reverse
	// framed: only stacks with an end marker can carry this cut (the
	// killed process's kernel sends a FIN, which plain TCP cannot tell
	// from an end).
	framed bool
	do     func(t *testing.T, serve, tunnel *proc, gw string)
}

var cuts = []cut{
	{"serve killed", false, true, func(t *testing.T, serve, _ *proc, _ string) { serve.Kill(); <-serve.Done() }},
	{"serve stopped, grace ran out", false, false, func(t *testing.T, serve, _ *proc, _ string) { serve.Stop(t) }},
	{"tunnel-serve connection reset", false, false, killSockets},
	{"tunnel killed", true, true, func(t *testing.T, _, tunnel *proc, _ string) { tunnel.Kill(); <-tunnel.Done() }},
	{"tunnel stopped, grace ran out", true, false, func(t *testing.T, _, tunnel *proc, _ string) { tunnel.Stop(t) }},
	{"tunnel-serve connection reset", true, false, killSockets},
}

// killSockets destroys the tunnel's connections to serve (ss -K): the
// tunnel's end fails with ECONNABORTED, and serve's is reset.
func killSockets(t *testing.T, _, _ *proc, gw string) {
	_, port, _ := net.SplitHostPort(gw)
	out, err := exec.Command("ss", "-K", "-t", "dst", "127.0.0.1", "dport", "=", port).CombinedOutput()
	if err != nil {
		t.Fatalf("ss -K: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "ESTAB") {
		t.Fatalf("ss -K destroyed no connection to %s:\n%s", gw, out)
	}
}

// TestCutMidStream cuts one hop of `vlink tunnel` -> `vlink serve` in the
// middle of a transfer, for every stack and way to cut (kill -9, a
// shutdown whose grace runs out, a connection reset with ss -K), and
// checks that the application beyond the cut sees an error, never a clean
// end of a short stream: downloading, the client reads; uploading, the
// target reads. The sender holds the second half back until the cut, so
// the cut falls mid-stream.
func TestCutMidStream(t *testing.T) {
	testenv.Programs(t, "ss")
	testenv.Root(t, "ss -K destroys sockets")
	const size = 64 << 20
	data := genData(size, 9)
	for _, stack := range append([]string{"tcp"}, abortStacks...) {
		for _, cut := range cuts {
			dir := "download"
			if cut.upload {
				dir = "upload"
			}
			t.Run(stack+"/"+dir+", "+cut.name, func(t *testing.T) {
				if cut.framed && stack == "tcp" {
					t.Skip("the plain stack has no end marker: a killed hop's FIN is all the next one sees")
				}
				if (stack == "shm" || strings.HasPrefix(stack, "quic")) && strings.Contains(cut.name, "connection reset") {
					t.Skipf("%s has no TCP connection between tunnel and serve to reset", stack)
				}
				if cut.upload {
					cutUpload(t, stack, data, cut)
				} else {
					cutDownload(t, stack, data, cut)
				}
			})
		}
	}
}

func cutDownload(t *testing.T, stack string, data []byte, cut cut) {
	size := int64(len(data))
	cutDone := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(cutDone) }) }
	defer release() // on a failure, frees the target's handler
	target := testnet.Listen(t, func(c net.Conn) {
		c.Write(data[:size/2])
		<-cutDone
		c.Write(data[size/2:])
	})
	serve, gw := startVLink(t, append([]string{"serve", "--target", target}, serveArgs(t, stack)...)...)
	tunnel, tun := startVLink(t, append([]string{"tunnel", "--to", gw, "--stack", stack}, keyArgs(t, stack)...)...)
	c, err := net.Dial("tcp", tun)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, size/2)); err != nil {
		t.Fatalf("the first half: %v", err)
	}
	cut.do(t, serve, tunnel, gw)
	release()
	n, err := io.Copy(io.Discard, c)
	checkCut(t, "the client", size/2+n, size, err)
}

func cutUpload(t *testing.T, stack string, data []byte, cut cut) {
	size := int64(len(data))
	type result struct {
		n   int64
		err error
	}
	half, got := make(chan struct{}), make(chan result, 1)
	target := testnet.Listen(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(60 * time.Second))
		n, err := io.CopyN(io.Discard, c, size/2)
		if err == nil {
			close(half)
			var m int64
			m, err = io.Copy(io.Discard, c)
			n += m
		}
		got <- result{n, err}
	})
	serve, gw := startVLink(t, append([]string{"serve", "--target", target}, serveArgs(t, stack)...)...)
	tunnel, tun := startVLink(t, append([]string{"tunnel", "--to", gw, "--stack", stack}, keyArgs(t, stack)...)...)
	c, err := net.Dial("tcp", tun)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.Write(data[:size/2]); err != nil {
		t.Fatalf("the first half: %v", err)
	}
	select {
	case <-half:
	case r := <-got:
		t.Fatalf("the target read %d bytes, then %v", r.n, r.err)
	}
	cut.do(t, serve, tunnel, gw)
	c.Write(data[size/2:]) // fails, or goes nowhere: the hop is cut
	r := <-got
	checkCut(t, "the target", r.n, size, r.err)
}

// serveArgs returns what vlink serve needs for stack: the key, and for
// shm and quic, a listener on that transport.
func serveArgs(t *testing.T, stack string) []string {
	if stack == "shm" {
		return []string{"--listen-stack", "shm"}
	}
	if strings.HasPrefix(stack, "quic") {
		return []string{"--listen-stack", "quic"}
	}
	return keyArgs(t, stack)
}

// keyArgs returns the --key-file flag for a stack that needs the key.
func keyArgs(t *testing.T, stack string) []string {
	if !strings.Contains(stack, "noise") {
		return nil
	}
	path := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(path, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--key-file", path}
}

// checkCut fails the test unless a reader that got n of size bytes, then
// err, saw the cut as an error.
func checkCut(t *testing.T, who string, n, size int64, err error) {
	t.Helper()
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Errorf("%s read %d of %d bytes, then nothing for 60 s: the cut never arrived", who, n, size)
	case err == nil && n < size:
		t.Errorf("%s read %d of %d bytes, then a clean end of stream: silently truncated", who, n, size)
	case err == nil:
		t.Errorf("%s read all %d bytes though a hop was killed halfway", who, n)
	default:
		t.Logf("%s read %d of %d bytes, then %v", who, n, size, err)
	}
}

// TestMuxStreamAbort: when serve's target resets one stream of a mux
// session in the middle of a download, that stream's client gets an
// error, and a stream of the same session running beside it carries on
// to its last byte, as does one opened after.
func TestMuxStreamAbort(t *testing.T) {
	testenv.Programs(t, "ss")
	const size = 8 << 20
	data := genData(size, 11)
	bRunning := make(chan struct{})
	target := testnet.Listen(t, func(c net.Conn) {
		var which [1]byte
		if _, err := io.ReadFull(c, which[:]); err != nil {
			return
		}
		switch which[0] {
		case 'A': // half, then a reset once B is under way
			c.Write(data[:size/2])
			<-bRunning
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		case 'B':
			c.Write(data[:size/4])
			close(bRunning)
			c.Write(data[size/4:])
		default:
			c.Write([]byte("after"))
		}
	})
	_, gw := startVLink(t, "serve", "--target", target)
	_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "mux")
	dial := func(which byte) net.Conn {
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := c.Write([]byte{which}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := dial('A')
	if _, err := io.ReadFull(a, make([]byte, size/4)); err != nil {
		t.Fatalf("A: %v", err)
	}
	b := dial('B')
	n, err := io.Copy(io.Discard, a)
	checkCut(t, "A's client", size/4+n, size, err)
	got, err := io.ReadAll(b)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("B's client read %d of %d bytes (equal: %v), then %v; want them all, then the end", len(got), size, bytes.Equal(got, data), err)
	}
	if got, err := io.ReadAll(dial('C')); err != nil || string(got) != "after" {
		t.Fatalf("a stream opened after the abort: %q, %v", got, err)
	}
	// All three streams went through one session.
	_, port, _ := net.SplitHostPort(gw)
	out, err := exec.Command("ss", "-Htn", "state", "established", "dst", "127.0.0.1", "dport", "=", port).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; strings.TrimSpace(string(out)) == "" || n != 1 {
		t.Fatalf("%d connections from the tunnel to serve, want the one session's:\n%s", n, out)
	}
}

// TestAbortAfterHalfClose (issue 38, point 3): a side that half-closed
// (shutdown(SHUT_WR)), read on, then reset its socket (SO_LINGER 0) makes
// the far side's writes fail within moments, as over plain TCP, through
// tunnel -> serve on every stack: the far side is the target when the
// client does it (download), the client when the target does (upload).
// Over mux, the stream's end record had already gone with the half-close,
// and the abort after it never reached the far side: the target wrote on
// into a window nobody opened, in CLOSE-WAIT, until the idle session
// closed. zstd is the control: it was right before. Compression above
// mux (zstd+mux) stops at its own end frame, and the mux stream's end
// record and close mark were read only at its Close: now its tail reader
// reads them (netconn/framed).
func TestAbortAfterHalfClose(t *testing.T) {
	const read = 10 << 20
	chunk := genData(1<<20, 38)
	// writeOn writes c until a write fails; it reports that error and
	// when it came.
	type failed struct {
		err error
		at  time.Time
	}
	writeOn := func(c net.Conn, out chan<- failed) {
		c.SetWriteDeadline(time.Now().Add(60 * time.Second))
		for {
			if _, err := c.Write(chunk); err != nil {
				out <- failed{err, time.Now()}
				return
			}
		}
	}
	// halfCloseThenReset shuts c's writing side, reads what the bound
	// allows, then resets c.
	halfCloseThenReset := func(c *net.TCPConn) (time.Time, error) {
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		if err := c.CloseWrite(); err != nil {
			return time.Time{}, err
		}
		if _, err := io.CopyN(io.Discard, c, read); err != nil {
			return time.Time{}, err
		}
		c.SetLinger(0)
		return time.Now(), c.Close()
	}
	check := func(t *testing.T, who string, reset time.Time, f failed) {
		t.Helper()
		switch {
		case errors.Is(f.err, os.ErrDeadlineExceeded):
			t.Fatalf("%s wrote on for 60 s after the reset", who)
		case !errors.Is(f.err, syscall.EPIPE) && !errors.Is(f.err, syscall.ECONNRESET):
			t.Fatalf("%s's write: %v, want EPIPE or ECONNRESET", who, f.err)
		case f.at.Sub(reset) > 5*time.Second:
			t.Fatalf("%s's write failed %v after the reset, want within 5 s", who, f.at.Sub(reset))
		}
		t.Logf("%s's write failed %v after the reset: %v", who, f.at.Sub(reset).Round(time.Millisecond), f.err)
	}
	for _, stack := range []string{"zstd", "mux", "mux+zstd", "zstd+mux"} {
		t.Run(stack+"/download", func(t *testing.T) {
			wrote := make(chan failed, 1)
			target := testnet.Listen(t, func(c net.Conn) { writeOn(c, wrote) })
			_, gw := startVLink(t, "serve", "--target", target)
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			c, err := net.Dial("tcp", tun)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			reset, err := halfCloseThenReset(c.(*net.TCPConn))
			if err != nil {
				t.Fatalf("the client: %v", err)
			}
			check(t, "the target", reset, <-wrote)
		})
		t.Run(stack+"/upload", func(t *testing.T) {
			type result struct {
				reset time.Time
				err   error
			}
			done := make(chan result, 1)
			target := testnet.Listen(t, func(c net.Conn) {
				reset, err := halfCloseThenReset(c.(*net.TCPConn))
				done <- result{reset, err}
			})
			_, gw := startVLink(t, "serve", "--target", target)
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			c, err := net.Dial("tcp", tun)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wrote := make(chan failed, 1)
			go writeOn(c, wrote)
			r := <-done
			if r.err != nil {
				t.Fatalf("the target: %v", r.err)
			}
			check(t, "the client", r.reset, <-wrote)
		})
	}
}

//go:build linux

package integration

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// abortStacks are the stacks whose streams carry an end marker: through
// each, a stream cut short by a killed hop must reach the application as
// an error. The plain tcp stack has none (it is TCP byte for byte, as
// socat or ssh -L are): there a killed hop's FIN is all the next one sees.
var abortStacks = []string{"zstd", "lz4", "s2", "deflate", "adaptive", "mux", "parallel"}

// TestKillMidStream ends one vlink process in the middle of a transfer
// through `vlink tunnel` -> `vlink serve` and checks that the application
// on the far side of the other process sees an error, never a clean end
// of a short stream: downloading, serve is killed -9 (or stopped, and cuts
// the transfer after its grace period) and the client reads; uploading,
// the tunnel is killed and the target reads.
// The target holds the second half of the download, and the client the
// second half of the upload, until the kill, so the cut falls mid-stream.
func TestKillMidStream(t *testing.T) {
	const size = 64 << 20
	data := genData(size, 9)
	for _, stack := range append([]string{"tcp"}, abortStacks...) {
		t.Run(stack+"/download, serve cut it after its grace", func(t *testing.T) {
			if stack == "mux" {
				// smux has no stream reset: an aborted stream ends with
				// its FIN. Only the session's death reaches its streams.
				t.Skip("known gap (issue 10, item 2): a mux stream cut on its own ends cleanly")
			}
			release := make(chan struct{})
			defer close(release)
			target := testnet.Listen(t, func(c net.Conn) {
				c.Write(data[:size/2])
				<-release // the rest never comes in time
			})
			serve, gw := startVLink(t, "serve", "--target", target)
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			c, err := net.Dial("tcp", tun)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := io.ReadFull(c, make([]byte, size/2)); err != nil {
				t.Fatalf("the first half: %v", err)
			}
			serve.Stop(t) // SIGTERM; --grace 1s
			n, err := io.Copy(io.Discard, c)
			checkCut(t, "the client", size/2+n, size, err)
		})
		if stack == "tcp" {
			continue // a killed hop's FIN is all the next one sees
		}
		t.Run(stack+"/download, serve killed", func(t *testing.T) {
			killed := make(chan struct{})
			var once sync.Once
			kill := func() { once.Do(func() { close(killed) }) }
			defer kill() // on a failure, frees the target's handler
			target := testnet.Listen(t, func(c net.Conn) {
				c.Write(data[:size/2])
				<-killed
				c.Write(data[size/2:])
			})
			serve, gw := startVLink(t, "serve", "--target", target)
			_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
			c, err := net.Dial("tcp", tun)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := io.ReadFull(c, make([]byte, size/2)); err != nil {
				t.Fatalf("the first half: %v", err)
			}
			serve.Kill()
			<-serve.Done()
			kill()
			n, err := io.Copy(io.Discard, c)
			checkCut(t, "the client", size/2+n, size, err)
		})
		t.Run(stack+"/upload, tunnel killed", func(t *testing.T) {
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
			_, gw := startVLink(t, "serve", "--target", target)
			tunnel, tun := startVLink(t, "tunnel", "--to", gw, "--stack", stack)
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
			tunnel.Kill()
			<-tunnel.Done()
			c.Write(data[size/2:]) // fails: the tunnel is gone
			r := <-got
			checkCut(t, "the target", r.n, size, r.err)
		})
	}
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

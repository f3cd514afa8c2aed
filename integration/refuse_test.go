//go:build linux

package integration

import (
	"net"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestRefusedTarget asks vlink serve, through vlink tunnel --via, for a
// target its --allow does not match. The target is up, so the only
// reason to refuse is the policy: the tunnel's client must see its
// connection end without a byte, serve must log the refusal and never
// reach the target, and a permitted connection must work afterwards.
func TestRefusedTarget(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)

	// The forbidden target: a listener that counts who reaches it.
	forbidden, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer forbidden.Close()
	var reached atomic.Int32
	go func() {
		for {
			c, err := forbidden.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()

	serve, gw := startVLink(t, "serve", "--allow", echo)
	deniedTun, denied := startVLink(t, "tunnel", "--via", gw, "--to", forbidden.Addr().String(), "--stack", "zstd")
	_, allowed := startVLink(t, "tunnel", "--via", gw, "--to", echo, "--stack", "zstd")

	t.Run("refused", func(t *testing.T) {
		// The tunnel dials the gateway as soon as it accepts, and resets
		// its client when refused: on a loaded machine that reset can
		// come before the client's connect returns, which then fails
		// with it. Either way the client gets no byte.
		c, err := net.Dial("tcp", denied)
		switch {
		case err != nil && !isReset(err):
			t.Fatal(err)
		case err == nil:
			defer c.Close()
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n")) // may fail once the tunnel closed
			n, took, err := waitClosed(c, 10*time.Second)
			if n > 0 || err != nil {
				t.Fatalf("client got %d bytes, then %v after %v; want the connection closed with no data", n, err, took)
			}
		}
		target := regexp.QuoteMeta(forbidden.Addr().String())
		// Both sides log why, at level info, naming the target.
		serve.WaitFor(t, regexp.MustCompile(`level=INFO [^\n]*`+target+` is not allowed`), 5*time.Second)
		deniedTun.WaitFor(t, regexp.MustCompile(`level=INFO [^\n]*`+target+`[^\n]* is not allowed`), 5*time.Second)
		if n := reached.Load(); n != 0 {
			t.Fatalf("the forbidden target was reached %d times", n)
		}
	})
	t.Run("permitted afterwards", func(t *testing.T) {
		checkEcho(t, allowed, genData(1<<20, 4))
	})
}

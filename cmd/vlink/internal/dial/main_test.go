package dial

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/serve"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/testnet"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The helpers below are cmd/vlink's test helpers, cut to what the tests
// of the dialing commands need: a "vlink serve" to dial through.

// output is a command's stdout or stderr, written while the test reads.
type output struct{ testnet.Buffer }

// waitFor waits until the output matches re and returns the match's first
// group.
func (o *output) waitFor(t testing.TB, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(o.String()); m != nil {
			if len(m) > 1 {
				return m[1]
			}
			return m[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %q in the output:\n%s", re, o.String())
	return ""
}

// serveProgram runs vlink serve, the command the dialing commands' tests
// dial through.
var serveProgram = &cli.Program{Name: "vlink", Commands: []*cli.Command{serve.Cmd}}

// A running command is serveProgram started in a goroutine until the
// test ends, when its context is cancelled as SIGINT would.
type running struct {
	stdout, stderr output
	cancel         context.CancelFunc
	done           chan int
}

func start(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan int, 1)}
	go func() { r.done <- serveProgram.Run(ctx, args, &r.stdout, &r.stderr) }()
	t.Cleanup(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("command did not exit after cancellation; stderr:\n%s", r.stderr.String())
		}
	})
	return r
}

// addr waits for the command to log that it listens, and returns where.
func (r *running) addr(t *testing.T) string {
	t.Helper()
	return r.stderr.waitFor(t, `msg=(?:serving|listening) addr=(\S+)`)
}

// A backend is a plain TCP server; each connection it accepts is handled
// by the next function sent on handlers.
type backend struct {
	l        net.Listener
	handlers chan func(net.Conn)
	wg       sync.WaitGroup
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{l: l, handlers: make(chan func(net.Conn), 1)}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				select {
				case h := <-b.handlers:
					h(c)
				case <-time.After(10 * time.Second):
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		b.wg.Wait()
	})
	return b
}

func (b *backend) addr() string { return b.l.Addr().String() }

func writeKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vlink.key")
	if err := os.WriteFile(path, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

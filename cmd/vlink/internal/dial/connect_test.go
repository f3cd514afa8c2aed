package dial

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
)

// runConnect runs "vlink connect ARGS" with stdin and stdout given, as
// main would with the process's.
func runConnect(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) (code int, stderr string) {
	fs := flag.NewFlagSet("vlink connect", flag.ContinueOnError)
	runner := connectFlags(fs)
	if err := fs.Parse(args); err != nil {
		return base.ExitUsage, err.Error()
	}
	var errb output
	log := slog.New(slog.NewTextHandler(&errb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	code = runner(ctx, &base.Env{Stdin: stdin, Stdout: stdout, Stderr: &errb, Log: log, Args: fs.Args()})
	return code, errb.String()
}

// closeRecorder is a stdout that remembers being closed.
type closeRecorder struct {
	bytes.Buffer
	closed bool
}

func (w *closeRecorder) Close() error { w.closed = true; return nil }

// failingWriter is a stdout whose reader has gone: every write fails.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// TestConnect carries stdin and stdout through vlink connect, straight
// with the tcp stack and through vlink serve with zstd and a key, and
// checks the bytes each way, the half-closes, the exit status, and that
// every abort reaches the other end as an error.
func TestConnect(t *testing.T) {
	const upSize, downSize = 3<<20 + 5, 2<<20 + 17
	be := newBackend(t)
	key := writeKey(t)
	srv := start(t, "serve", "--log-level", "debug", "--listen", "127.0.0.1:0", "--allow", be.addr(), "--key-file", key)
	gw := srv.addr(t)
	for _, rt := range []struct {
		name string
		args []string
	}{
		{"tcp", []string{"--stack", "tcp", be.addr()}},
		{"zstd via serve", []string{"--stack", "zstd", "--via", gw, "--key-file", key, "--known-nodes", "none", be.addr()}},
	} {
		t.Run(rt.name, func(t *testing.T) {
			up, down := testnet.RandomBytes(upSize, 1), testnet.RandomBytes(downSize, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			t.Run("stdin ends first", func(t *testing.T) {
				got := make(chan [32]byte, 1)
				be.handlers <- func(c net.Conn) {
					h := sha256.New()
					if n, err := io.Copy(h, c); err != nil || n != upSize {
						t.Errorf("backend: received %d bytes, error %v", n, err)
					}
					got <- [32]byte(h.Sum(nil))
					c.Write(down) // then the backend closes
				}
				var stdout closeRecorder
				code, stderr := runConnect(ctx, bytes.NewReader(up), &stdout, rt.args...)
				if code != base.ExitOK {
					t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
				}
				if sum := <-got; sum != sha256.Sum256(up) {
					t.Errorf("the backend received bytes whose SHA-256 differs from stdin's")
				}
				if stdout.Len() != downSize || sha256.Sum256(stdout.Bytes()) != sha256.Sum256(down) {
					t.Errorf("stdout got %d bytes, want the backend's %d", stdout.Len(), downSize)
				}
				if !stdout.closed {
					t.Errorf("stdout was not closed at the end of the far side's stream")
				}
			})

			t.Run("far side ends first", func(t *testing.T) {
				// The backend's whole answer, half-closed, then it reads;
				// stdin is written only once stdout has ended, so stdout
				// must end while stdin is still open.
				got := make(chan [32]byte, 1)
				be.handlers <- func(c net.Conn) {
					if _, err := c.Write(down); err != nil {
						t.Errorf("backend: %v", err)
					}
					netconn.CloseWrite(c)
					h := sha256.New()
					io.Copy(h, c)
					got <- [32]byte(h.Sum(nil))
				}
				inR, inW := io.Pipe()
				outR, outW := io.Pipe()
				done := make(chan int, 1)
				go func() {
					code, stderr := runConnect(ctx, inR, outW, rt.args...)
					if code != base.ExitOK {
						t.Errorf("exit code %d; stderr:\n%s", code, stderr)
					}
					done <- code
				}()
				received, err := io.ReadAll(outR)
				if err != nil || sha256.Sum256(received) != sha256.Sum256(down) {
					t.Errorf("stdout: %d bytes (want %d), error %v", len(received), downSize, err)
				}
				inW.Write(up)
				inW.Close()
				<-done
				if sum := <-got; sum != sha256.Sum256(up) {
					t.Errorf("the backend received bytes whose SHA-256 differs from stdin's")
				}
			})

			t.Run("far side resets", func(t *testing.T) {
				be.handlers <- func(c net.Conn) {
					// A byte first: reset at once, the connection can
					// fail before the dial has seen it succeed.
					if _, err := c.Read(make([]byte, 1)); err != nil {
						t.Errorf("backend: %v", err)
					}
					c.Write(down[:downSize/2])
					netconn.Abort(c)
				}
				inR, inW := io.Pipe() // stdin stays open: the reset alone must end it
				defer inW.Close()
				go inW.Write(up[:1])
				var stdout closeRecorder
				code, stderr := runConnect(ctx, inR, &stdout, rt.args...)
				if code != base.ExitFailure || !strings.Contains(stderr, "vlink connect: receiving from") {
					t.Errorf("exit code %d (want %d), stderr:\n%s", code, base.ExitFailure, stderr)
				}
				if stdout.Len() >= downSize {
					t.Errorf("stdout got %d bytes of a stream cut at %d", stdout.Len(), downSize/2)
				}
			})

			// A consumer that stopped reading: quiet, status 1; what it
			// sent arrives whole if it ended its stdin, else the far side
			// sees a reset once the grace period is over.
			for _, ended := range []bool{true, false} {
				name := "stdout's reader gone, stdin ended"
				if !ended {
					name = "stdout's reader gone, stdin open"
				}
				t.Run(name, func(t *testing.T) {
					type got struct {
						data []byte
						err  error
					}
					gots := make(chan got, 1)
					be.handlers <- func(c net.Conn) {
						c.SetDeadline(time.Now().Add(10 * time.Second))
						// Little enough that vlink connect reads it all: a
						// close would send a FIN, not a reset. The reset
						// may come as the write's error or the read's: a
						// socket reports it once.
						_, werr := c.Write(down[:1000])
						data, rerr := io.ReadAll(c)
						gots <- got{data, errors.Join(werr, rerr)}
					}
					var stdin io.Reader = bytes.NewReader(up[:1000])
					if !ended {
						inR, inW := io.Pipe()
						defer inW.Close()
						stdin = inR
					}
					code, stderr := runConnect(ctx, stdin, failingWriter{}, rt.args...)
					if code != base.ExitFailure || strings.Contains(stderr, "vlink connect:") {
						t.Errorf("exit code %d (want %d, quietly), stderr:\n%s", code, base.ExitFailure, stderr)
					}
					g := <-gots
					switch {
					case ended && (g.err != nil || !bytes.Equal(g.data, up[:1000])):
						t.Errorf("the backend read %d of 1000 bytes, then %v; want all and a clean end", len(g.data), g.err)
					case !ended && g.err == nil:
						t.Errorf("the backend read a clean end of stream from a vlink connect that failed")
					}
				})
			}

			t.Run("interrupted", func(t *testing.T) {
				errs := make(chan error, 1)
				be.handlers <- func(c net.Conn) {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					_, err := io.Copy(io.Discard, c)
					errs <- err
				}
				inR, inW := io.Pipe()
				defer inW.Close()
				ictx, icancel := context.WithCancel(ctx)
				go func() {
					inW.Write(up[:1000]) // through: the connection is up
					icancel()
				}()
				code, stderr := runConnect(ictx, inR, io.Discard, rt.args...)
				if code != base.ExitFailure || !strings.Contains(stderr, "interrupted") {
					t.Errorf("exit code %d (want %d), stderr:\n%s", code, base.ExitFailure, stderr)
				}
				if err := <-errs; err == nil {
					t.Errorf("the backend read a clean end of stream from an interrupted vlink connect")
				}
			})
		})
	}
}

// TestConnectHangup is ssh ending its ProxyCommand: its pipes closed,
// then SIGHUP. What it wrote is delivered and ended; with stdin still
// open past the grace period, the far side sees a reset.
func TestConnectHangup(t *testing.T) {
	for _, ended := range []bool{true, false} {
		t.Run(fmt.Sprintf("stdin ended %v", ended), func(t *testing.T) {
			c, s := testnet.TCPPair(t)
			defer s.Close()
			s.SetDeadline(time.Now().Add(10 * time.Second))
			go s.Write([]byte("unread by the consumer"))
			inR, inW := io.Pipe()
			defer inW.Close()
			hangup := make(chan os.Signal, 1)
			r := &stdioRelay{c: c, stdin: inR, stdout: io.Discard, hangup: hangup, grace: 100 * time.Millisecond}
			done := make(chan error, 1)
			go func() { done <- r.run(context.Background()) }()
			inW.Write([]byte("hello"))
			if ended {
				inW.Close()
			}
			hangup <- syscall.SIGHUP
			got, err := io.ReadAll(s)
			if rerr := <-done; !errors.Is(rerr, errConsumerGone) {
				t.Errorf("relay: %v, want errConsumerGone", rerr)
			}
			switch {
			case ended && (err != nil || string(got) != "hello"):
				t.Errorf("the far side read %q, then %v; want hello and a clean end", got, err)
			case !ended && err == nil:
				t.Errorf("the far side read %q and a clean end from a relay whose stdin never ended", got)
			}
		})
	}
}

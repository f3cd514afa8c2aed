//go:build linux

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/lab"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// seeded is a reproducible byte stream, so a receiver can check what it
// got against what was sent without keeping a copy.
type seeded struct{ r *rand.ChaCha8 }

func newSeeded(seed byte) *seeded { return &seeded{rand.NewChaCha8([32]byte{seed})} }

func (s *seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

// prefixSink accepts one connection and reads it to the end, checking
// that every byte is the seeded stream's next one.
type prefixSink struct {
	done chan struct{}
	n    atomic.Int64
	ok   bool  // read after done
	err  error // read after done
}

func startPrefixSink(t *testing.T, ln net.Listener, seed byte) *prefixSink {
	s := &prefixSink{done: make(chan struct{}), ok: true}
	go func() {
		defer close(s.done)
		c, err := ln.Accept()
		if err != nil {
			s.err = err
			return
		}
		defer c.Close()
		want := newSeeded(seed)
		got, exp := make([]byte, 64<<10), make([]byte, 64<<10)
		for {
			m, err := c.Read(got)
			io.ReadFull(want, exp[:m])
			for i := range m {
				if got[i] != exp[i] {
					s.ok = false
				}
			}
			s.n.Add(int64(m))
			if err != nil {
				if err != io.EOF {
					s.err = err
				}
				return
			}
		}
	}()
	return s
}

// labProc runs a program in a lab host with the harness's cleanup.
func labProc(t testing.TB, l *lab.Lab, host, name string, args ...string) *proc {
	t.Helper()
	p := startProc(t, "ip", append([]string{"netns", "exec", l.Netns(host), name}, args...)...)
	p.Name = fmt.Sprintf("%s@%s", strings.TrimPrefix(name, vlinkBin), host)
	return p
}

// TestParallelFaultsInLab cuts a parallel connection on a lab link while
// it carries data, the two ways it happens: a firewall that starts
// dropping one substream's packets (silently: only the stall timeout can
// tell), and the far process killed. Each time the program sees its
// connection fail within bounded time, and everything the far end
// received is exactly the beginning of what was sent.
func TestParallelFaultsInLab(t *testing.T) {
	l := lab.New(t, lab.Topology{
		Hosts: []lab.Host{{Name: "client"}, {Name: "server"}},
		Links: []lab.Link{{A: "client", B: "server", Rate: 200 * lab.Mbit, RTT: lab.Duration(10 * time.Millisecond)}},
	})
	server := l.Addr("server").String()
	tests := []struct {
		name string
		cut  func(t *testing.T, serve *proc)
		// resetAtSink: the sink must see a failure too, not an end of
		// stream (a killed process's kernel may end it with a FIN).
		resetAtSink bool
	}{
		{"firewall drops one substream", func(t *testing.T, _ *proc) {
			testenv.Programs(t, "nft", "ss")
			port := substreamPort(t, l, server+":7000")
			ruleset := fmt.Sprintf(`table inet vcut {
	chain out { type filter hook output priority 0; tcp sport %d drop; }
	chain in { type filter hook input priority 0; tcp dport %d drop; }
}`, port, port)
			cmd := l.Command("client", "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(ruleset)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nft: %v\n%s", err, out)
			}
			t.Cleanup(func() { l.Command("client", "nft", "delete", "table", "inet", "vcut").Run() })
		}, true},
		{"far process killed", func(t *testing.T, serve *proc) {
			serve.Kill() // ip netns exec execs vlink: same process
		}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sinkPort := 9000 + i
			ln, err := l.Listen("server", "tcp", fmt.Sprintf("127.0.0.1:%d", sinkPort))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			sink := startPrefixSink(t, ln, byte(i+1))
			serve := labProc(t, l, "server", vlinkBin, "serve", "--listen", server+":7000",
				"--target", fmt.Sprintf("127.0.0.1:%d", sinkPort), "--grace", "1s")
			tunnel := labProc(t, l, "client", vlinkBin, "tunnel", "--listen", "127.0.0.1:8000",
				"--to", server+":7000", "--stack", "parallel:streams=4,stall-timeout=3s", "--grace", "1s")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, w := range []struct {
				host string
				port int
			}{{"server", 7000}, {"client", 8000}} {
				if err := l.WaitListening(ctx, w.host, w.port); err != nil {
					t.Fatal(err)
				}
			}
			c, err := l.DialContext(ctx, "client", "tcp", "127.0.0.1:8000")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var sent int64
			var sendErr error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent, sendErr = io.Copy(c, io.LimitReader(newSeeded(byte(i+1)), 1<<40))
			}()
			// Cut once a few MB went through.
			for sink.n.Load() < 4<<20 {
				select {
				case <-sink.done:
					t.Fatalf("sink ended early after %d bytes: %v", sink.n.Load(), sink.err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			tt.cut(t, serve)
			cutAt := time.Now()
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			_, readErr := c.Read(make([]byte, 1))
			wg.Wait()
			took := time.Since(cutAt)
			<-sink.done
			t.Logf("after %v: sender sent %d bytes (%v), read %v; sink got %d bytes, in order %v, then %v",
				took.Round(time.Millisecond), sent, sendErr, readErr, sink.n.Load(), sink.ok, sink.err)
			// The kernel reports a reset once: to the write or to the read,
			// whichever comes first (the other then sees an end).
			if !isReset(sendErr) && !isReset(readErr) {
				t.Errorf("the program saw write error %v and read %v, want a reset", sendErr, readErr)
			}
			if took > 30*time.Second {
				t.Errorf("the failure took %v", took)
			}
			if !sink.ok {
				t.Error("the sink received bytes that are not the beginning of what was sent")
			}
			if tt.resetAtSink && sink.err == nil {
				t.Error("the sink saw a clean end of stream: a cut looked like a complete transfer")
			}
			if tt.name != "far process killed" {
				if !regexp.MustCompile(`substream \d`).MatchString(tunnel.Output() + serve.Output()) {
					t.Errorf("no log names the failed substream; tunnel:\n%s\nserve:\n%s", realserver.Tail(tunnel.Output(), 2000), realserver.Tail(serve.Output(), 2000))
				}
			}
		})
	}
}

// substreamPort returns the local port of one established connection
// from the client host to addr.
func substreamPort(t *testing.T, l *lab.Lab, addr string) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.Netns("client"), "ss", "-Htn", "state", "established").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[3] == addr {
			_, p, _ := net.SplitHostPort(f[2])
			var port int
			fmt.Sscan(p, &port)
			return port
		}
	}
	t.Fatalf("no connection to %s in:\n%s", addr, out)
	return 0
}

// isReset reports whether err is what a socket's user gets once the
// peer reset the connection: on a read, on a write, or on the half-close
// after them (ENOTCONN: a reset socket is no longer connected, where one
// that got a FIN still is).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOTCONN)
}

// TestParallelAutoInLab runs `parallel:streams=8,auto` over a lab link
// whose shaper caps each TCP connection at a tenth of the link, where
// only more connections carry more: an upload and a download each grow
// to 8 substreams (counted on the client's side of the link), and every
// byte arrives in order. Before goodput counted what the dialer read,
// a download stayed at the first 2.
func TestParallelAutoInLab(t *testing.T) {
	testenv.Programs(t, "ss")
	l := lab.New(t, lab.Topology{
		Hosts: []lab.Host{{Name: "client"}, {Name: "server"}},
		Links: []lab.Link{{A: "client", B: "server", Rate: 200 * lab.Mbit, FlowRate: 20 * lab.Mbit,
			RTT: lab.Duration(20 * time.Millisecond)}},
		Sysctls: lab.TCPSysctls,
	})
	server := l.Addr("server").String()
	const max = 8
	for i, download := range []bool{false, true} {
		name := "upload"
		if download {
			name = "download"
		}
		t.Run(name, func(t *testing.T) {
			port := 7000 + i
			targetPort := 9100 + i
			ln, err := l.Listen("server", "tcp", fmt.Sprintf("127.0.0.1:%d", targetPort))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			seed := byte(10 + i)
			var sink *prefixSink
			if download {
				go func() {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
					io.Copy(c, newSeeded(seed)) // until the client goes
				}()
			} else {
				sink = startPrefixSink(t, ln, seed)
			}
			labProc(t, l, "server", vlinkBin, "serve", "--listen", fmt.Sprintf("%s:%d", server, port),
				"--target", fmt.Sprintf("127.0.0.1:%d", targetPort), "--grace", "1s")
			tunnelPort := 8100 + i
			labProc(t, l, "client", vlinkBin, "tunnel", "--listen", fmt.Sprintf("127.0.0.1:%d", tunnelPort),
				"--to", fmt.Sprintf("%s:%d", server, port), "--stack", fmt.Sprintf("parallel:streams=%d,auto", max), "--grace", "1s")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := l.WaitListening(ctx, "server", port); err != nil {
				t.Fatal(err)
			}
			if err := l.WaitListening(ctx, "client", tunnelPort); err != nil {
				t.Fatal(err)
			}
			c, err := l.DialContext(ctx, "client", "tcp", fmt.Sprintf("127.0.0.1:%d", tunnelPort))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var (
				moved   atomic.Int64
				inOrder = true
				ioErr   error
				wg      sync.WaitGroup
			)
			stop := make(chan struct{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !download {
					n, err := io.Copy(c, &stoppable{newSeeded(seed), stop, &moved})
					ioErr = err
					moved.Store(n)
					c.(interface{ CloseWrite() error }).CloseWrite()
					return
				}
				want := newSeeded(seed)
				got, exp := make([]byte, 64<<10), make([]byte, 64<<10)
				for {
					select {
					case <-stop:
						return
					default:
					}
					m, err := c.Read(got)
					io.ReadFull(want, exp[:m])
					if string(got[:m]) != string(exp[:m]) {
						inOrder = false
					}
					moved.Add(int64(m))
					if err != nil {
						ioErr = err
						return
					}
				}
			}()
			// The substreams on the client's side of the link, until all
			// are there or the time is up.
			addr := fmt.Sprintf("%s:%d", server, port)
			var subs int
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if subs = established(t, l, addr); subs >= max {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			close(stop)
			if download {
				c.Close()
			}
			wg.Wait()
			t.Logf("%s: %d substreams, %d bytes moved, then %v", name, subs, moved.Load(), ioErr)
			if subs != max {
				t.Errorf("%s through parallel:streams=%d,auto on a link capping each flow: %d substreams after 20 s, want %d", name, max, subs, max)
			}
			if download {
				if !inOrder {
					t.Error("the download read bytes that are not the seeded stream's")
				}
				return
			}
			if ioErr != nil {
				t.Errorf("upload: %v", ioErr)
			}
			<-sink.done
			if !sink.ok || sink.err != nil || sink.n.Load() != moved.Load() {
				t.Errorf("the target got %d bytes (in order: %v, then %v) of the %d sent", sink.n.Load(), sink.ok, sink.err, moved.Load())
			}
		})
	}
}

// stoppable reads r until stop is closed, then ends; n counts what it
// gave.
type stoppable struct {
	r    io.Reader
	stop <-chan struct{}
	n    *atomic.Int64
}

func (s *stoppable) Read(p []byte) (int, error) {
	select {
	case <-s.stop:
		return 0, io.EOF
	default:
	}
	m, err := s.r.Read(p)
	s.n.Add(int64(m))
	return m, err
}

// established counts the client host's established connections to addr.
func established(t *testing.T, l *lab.Lab, addr string) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.Netns("client"), "ss", "-Htn", "state", "established").Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[3] == addr {
			n++
		}
	}
	return n
}

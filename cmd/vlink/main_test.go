package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/bench"
	"github.com/vlink-dev/vlink/internal/cli/clitest"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// envAsVlink makes the test binary run as vlink itself: the exec tests
// see how a vlink process takes and ends by signals, which run() in a
// goroutine cannot show.
const envAsVlink = "VLINK_TEST_AS_VLINK"

func TestMain(m *testing.M) {
	if os.Getenv(envAsVlink) == "1" {
		os.Unsetenv(envAsVlink)
		main() // exits
	}
	goleak.VerifyTestMain(m)
}

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

// A running command is run() started in a goroutine, as main would run
// it, until stop cancels its context as SIGINT would.
type running struct {
	stdout, stderr output
	cancel         context.CancelFunc
	done           chan int
	once           sync.Once
	code           int
}

func start(t *testing.T, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan int, 1)}
	go func() { r.done <- run(ctx, args, &r.stdout, &r.stderr) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// addr waits for the command to log that it listens, and returns where.
func (r *running) addr(t *testing.T) string {
	t.Helper()
	return r.stderr.waitFor(t, `msg=(?:serving|listening) addr=(\S+)`)
}

// stop sends the command the equivalent of SIGINT and returns its exit
// code.
func (r *running) stop(t *testing.T) int {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.code = <-r.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("command did not exit after cancellation; stderr:\n%s", r.stderr.String())
		}
	})
	return r.code
}

// runSync runs a command to completion.
func runSync(args ...string) (code int, stdout, stderr string) {
	var o, e output
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
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

// TestServeTunnel carries a few MiB each way from a client through
// "vlink tunnel", a compressing stack and "vlink serve" to a plain
// backend, with each side half-closing first, and checks every byte.
func TestServeTunnel(t *testing.T) {
	const upSize, downSize = 3<<20 + 5, 2<<20 + 17
	be := newBackend(t)
	key := writeKey(t)
	routes := []struct {
		name   string
		serve  func() []string
		tunnel func(serve string) []string
	}{
		{"target",
			func() []string { return []string{"--target", be.addr()} },
			func(serve string) []string { return []string{"--to", serve, "--stack", "zstd"} }},
		{"via allowed target",
			func() []string { return []string{"--allow", be.addr()} },
			func(serve string) []string {
				return []string{"--via", serve, "--to", be.addr(), "--stack", "zstd:level=1"}
			}},
		{"key",
			func() []string { return []string{"--target", be.addr(), "--key-file", key} },
			func(serve string) []string { return []string{"--to", serve, "--stack", "lz4", "--key-file", key} }},
	}
	for _, rt := range routes {
		t.Run(rt.name, func(t *testing.T) {
			srv := start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "debug"}, rt.serve()...)...)
			tun := start(t, append([]string{"tunnel", "--listen", "127.0.0.1:0", "--log-level", "debug"}, rt.tunnel(srv.addr(t))...)...)
			tunAddr := tun.addr(t)
			for _, clientFirst := range []bool{true, false} {
				name := "server closes first"
				if clientFirst {
					name = "client closes first"
				}
				t.Run(name, func(t *testing.T) {
					up, down := testnet.RandomBytes(upSize, 1), testnet.RandomBytes(downSize, 2)
					got := make(chan [32]byte, 1)
					be.handlers <- func(c net.Conn) {
						var err error
						if !clientFirst {
							// Everything down, half-closed, before reading.
							if _, err = c.Write(down); err == nil {
								err = netconn.CloseWrite(c)
							}
						}
						h := sha256.New()
						n, rerr := io.Copy(h, c)
						if err != nil || rerr != nil || n != upSize {
							t.Errorf("backend: received %d bytes, write error %v, read error %v", n, err, rerr)
						}
						if clientFirst {
							if _, err = c.Write(down); err == nil {
								err = netconn.CloseWrite(c)
							}
							if err != nil {
								t.Errorf("backend: writing after the client's half-close: %v", err)
							}
						}
						got <- [32]byte(h.Sum(nil))
					}
					c, err := net.Dial("tcp", tunAddr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(30 * time.Second))
					send := func() {
						if _, err := c.Write(up); err != nil {
							t.Fatalf("client: write: %v", err)
						}
						if err := netconn.CloseWrite(c); err != nil {
							t.Fatalf("client: CloseWrite: %v", err)
						}
					}
					if clientFirst {
						send()
					}
					received, err := io.ReadAll(c)
					if err != nil {
						t.Fatalf("client: read: %v", err)
					}
					if !clientFirst {
						send()
					}
					if len(received) != downSize || sha256.Sum256(received) != sha256.Sum256(down) {
						t.Errorf("client received %d bytes, want %d with SHA-256 of what the backend sent", len(received), downSize)
					}
					if sum := <-got; sum != sha256.Sum256(up) {
						t.Errorf("backend received bytes whose SHA-256 differs from what the client sent")
					}
				})
			}
			if code := tun.stop(t); code != base.ExitOK {
				t.Errorf("tunnel exited %d; stderr:\n%s", code, tun.stderr.String())
			}
			if code := srv.stop(t); code != base.ExitOK {
				t.Errorf("serve exited %d; stderr:\n%s", code, srv.stderr.String())
			}
			if s := srv.stderr.String(); !strings.Contains(s, "msg=forwarding") {
				t.Errorf("serve did not log the connections at debug:\n%s", s)
			}
			if strings.Contains(srv.stderr.String(), "0123456789abcdef") || strings.Contains(tun.stderr.String(), "0123456789abcdef") {
				t.Errorf("the key appears in the logs")
			}
		})
	}
}

func TestServeRefusesToBeAnOpenProxy(t *testing.T) {
	code, _, stderr := runSync("serve", "--listen", "127.0.0.1:0")
	if code != base.ExitUsage {
		t.Errorf("exit code %d, want %d", code, base.ExitUsage)
	}
	for _, want := range []string{"--target", "--allow", "open proxy"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
}

// A target outside --allow is refused, and the reason reaches the dialer
// and the tunnel's log.
func TestServeTargetNotAllowed(t *testing.T) {
	be := newBackend(t)
	_, port, _ := net.SplitHostPort(be.addr())
	p, _ := strconv.Atoi(port)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--allow", "127.0.0.1:"+port)
	srvAddr := srv.addr(t)
	for _, target := range []string{"127.0.0.2:" + port, "127.0.0.1:" + strconv.Itoa(p+1), "localhost:" + port} {
		t.Run(target, func(t *testing.T) {
			d := vlink.Dialer{Stack: vlink.MustParse("zstd"), Via: srvAddr, Timeout: 10 * time.Second}
			c, err := d.Dial("tcp", target)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var re *vlink.RefusedError
			if !errors.Is(err, vlink.ErrNotAllowed) || !errors.As(err, &re) || re.Code != vlink.CodeTarget {
				t.Fatalf("got %v, want a refusal with CodeTarget", err)
			}
			if !strings.Contains(re.Reason, target) {
				t.Errorf("the reason %q does not name the target", re.Reason)
			}

			tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--via", srvAddr, "--to", target, "--stack", "zstd")
			if b, err := dialRead(tun.addr(t)); len(b) != 0 || !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the tunnel's client read %d bytes, then %v; want a reset", len(b), err)
			}
			tun.stderr.waitFor(t, `level=INFO msg="cannot reach destination".*target not allowed: forwarding to `+regexp.QuoteMeta(target))
		})
	}
}

// An unreachable target is reported to VLink dialers, with the reason,
// and plain connections to it are closed and logged.
func TestServeUnreachableTarget(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", dead)
	srvAddr := srv.addr(t)

	t.Run("vlink dialer", func(t *testing.T) {
		d := vlink.Dialer{Stack: vlink.MustParse("zstd"), Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", srvAddr)
		if err == nil {
			c.Close()
			t.Fatal("dial succeeded")
		}
		var re *vlink.RefusedError
		// Unreachable, and how: the port refused, as a connect of the
		// dialer's own would have said.
		if !errors.Is(err, vlink.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &re) || re.Code != vlink.CodeTargetRefused {
			t.Fatalf("got %v, want a refusal with CodeTargetRefused", err)
		}
		if !strings.Contains(re.Reason, dead) {
			t.Errorf("the reason %q does not name the target", re.Reason)
		}
	})
	t.Run("tunnel", func(t *testing.T) {
		tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", srvAddr, "--stack", "lz4")
		// A reset, as a refused connect would give: a clean end would
		// read as an empty answer.
		if b, err := dialRead(tun.addr(t)); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read %q, %v; want a reset", b, err)
		}
		tun.stderr.waitFor(t, `msg="cannot reach destination".*target refused the connection: .*`+regexp.QuoteMeta(dead))
	})
	t.Run("plain", func(t *testing.T) {
		c, err := net.Dial("tcp", srvAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		if b, err := io.ReadAll(c); len(b) != 0 || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read %q, %v; want the connection reset", b, err)
		}
		srv.stderr.waitFor(t, `level=WARN msg="target unreachable: plain connection closed".*target=`+regexp.QuoteMeta(dead))
	})
}

// On SIGINT a server stops accepting, lets connections run for the grace
// period, then resets them and exits 0.
func TestServeGracefulShutdown(t *testing.T) {
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--grace", "300ms")
	srvAddr := srv.addr(t)
	holding := make(chan struct{})
	be.handlers <- func(c net.Conn) {
		io.Copy(c, c) // echo until the relay is cut
		close(holding)
	}
	c, err := net.Dial("tcp", srvAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 5)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if code := srv.stop(t); code != base.ExitOK {
		t.Errorf("exit code %d, want 0; stderr:\n%s", code, srv.stderr.String())
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("shutdown took %v with a 300ms grace period and a connection that stays open", took)
	}
	// Cut, not ended: the client must not take it for a complete stream.
	if _, err := c.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after shutdown: %v, want a reset", err)
	}
	<-holding
	if s := srv.stderr.String(); !strings.Contains(s, `msg="closed connections still open after the grace period" count=1`) {
		t.Errorf("shutdown did not log the connections it cut:\n%s", s)
	}
	if _, err := net.DialTimeout("tcp", srvAddr, time.Second); err == nil {
		t.Errorf("still accepting after shutdown")
	}
}

// dialRead connects to addr and reads until the end. On loopback a reset
// can arrive before connect returns: then the dial's error is returned.
func dialRead(addr string) ([]byte, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return io.ReadAll(c)
}

// TestServeIdleTimeout: a plain connection idle for --idle-timeout is
// reset (the client reads an error, serve logs it); one that keeps
// carrying bytes, in either direction, is not.
func TestServeIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--idle-timeout", idle.String())
	srvAddr := srv.addr(t)
	for _, tc := range []struct {
		name   string
		active bool
	}{{"idle", false}, {"active", true}} {
		t.Run(tc.name, func(t *testing.T) {
			be.handlers <- func(c net.Conn) { io.Copy(c, c) }
			c, err := net.Dial("tcp", srvAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * idle))
			one := make([]byte, 1)
			for i := range 10 {
				if !tc.active && i > 0 {
					break
				}
				if _, err := c.Write(one); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(c, one); err != nil {
					t.Fatalf("echo %d: %v", i, err)
				}
				time.Sleep(idle / 3)
			}
			if tc.active {
				return // 10 echoes over 3 idle periods: not cut
			}
			if _, err := c.Read(one); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read on an idle connection: %v, want a reset", err)
			}
			srv.stderr.waitFor(t, `level=INFO msg="connection reset: idle".*idle_timeout=300ms`)
		})
	}
}

func TestBench(t *testing.T) {
	args := []string{"bench", "--size", "1M", "--stacks", "tcp,zstd", "--rounds", "2", "--pings", "100"}
	t.Run("table", func(t *testing.T) {
		plot := filepath.Join(t.TempDir(), "goodput.svg")
		code, stdout, stderr := runSync(append(args, "--plot", plot)...)
		if code != base.ExitOK {
			t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
		}
		tables := strings.Split(strings.TrimSpace(stdout), "\n\n")
		if len(tables) != 3 {
			t.Fatalf("want two tables and a note, got:\n%s", stdout)
		}
		if !strings.Contains(tables[2], "tcp:cc=bbr") {
			t.Errorf("the note after the link table does not say when to use tcp:cc=bbr:\n%s", tables[2])
		}
		lines := strings.Split(tables[0], "\n")
		if len(lines) != 2+6 {
			t.Fatalf("want a comment, a header and 6 rows, got:\n%s", stdout)
		}
		if got := strings.Fields(lines[1]); strings.Join(got, " ") != "STACK DATA MB/s MIN..MAX xRAW LATENCY xRAW WIRE/BYTE" {
			t.Errorf("header %q", lines[1])
		}
		row := regexp.MustCompile(`^(\S+) +(text|random) +[0-9.]+ +[0-9.]+\.\.[0-9.]+ +[0-9.]+ +[0-9.]+µs +[0-9.]+ +([0-9.]+)$`)
		var stacks []string
		for _, l := range lines[2:] {
			m := row.FindStringSubmatch(l)
			if m == nil {
				t.Errorf("row %q lacks a column", l)
				continue
			}
			stacks = append(stacks, m[1]+"/"+m[2])
		}
		if want := "raw/text raw/random tcp/text tcp/random zstd+tcp/text zstd+tcp/random"; strings.Join(stacks, " ") != want {
			t.Errorf("rows %v, want %s", stacks, want)
		}
		if !strings.Contains(stderr, "bench: round 1/2") {
			t.Errorf("no progress on stderr:\n%s", stderr)
		}
		// One link row per rate and kind of data, each naming a best
		// stack that was measured (raw when no other is faster beyond
		// the noise, said so when one's median was).
		links := strings.Split(tables[1], "\n")
		linkRow := regexp.MustCompile(`^(text|random) +[0-9.]+ [kMG]?bit/s +[0-9.]+ +(raw|tcp|zstd\+tcp|raw \(no difference\)) +[0-9.]+ +[0-9.]+ +\S+ [0-9.]+$`)
		if len(links) != 2+2*4 {
			t.Fatalf("want a comment, a header and 8 link rows, got:\n%s", tables[1])
		}
		for _, l := range links[2:] {
			if !linkRow.MatchString(l) {
				t.Errorf("link row %q", l)
			}
		}
		// The plot: an SVG with a line of 101 points per stack and kind.
		f, err := os.Open(plot)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var plotted []string
		dec := xml.NewDecoder(f)
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("the plot is not well-formed XML: %v", err)
			}
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
				var stack, points string
				for _, a := range se.Attr {
					switch a.Name.Local {
					case "data-stack":
						stack = a.Value
					case "points":
						points = a.Value
					}
				}
				if n := len(strings.Fields(points)); n != 101 {
					t.Errorf("%s's line has %d points, want 101", stack, n)
				}
				plotted = append(plotted, stack)
			}
		}
		if want := "raw tcp zstd+tcp raw tcp zstd+tcp"; strings.Join(plotted, " ") != want {
			t.Errorf("plot lines %v, want %s", plotted, want)
		}
	})
	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := runSync(append(args, "--json", "--data", "text", "--log-level", "warn")...)
		if code != base.ExitOK {
			t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
		}
		if stderr != "" {
			t.Errorf("progress printed at --log-level warn:\n%s", stderr)
		}
		var r bench.Report
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("%v in:\n%s", err, stdout)
		}
		if len(r.Results) != 3 || r.Size != 1<<20 {
			t.Fatalf("want 3 results for 1M, got %+v", r)
		}
		for _, row := range r.Results {
			if row.MBps <= 0 || row.LatencyNs <= 0 || row.Ratio <= 0 || row.LatencyRatio <= 0 {
				t.Errorf("%s: missing figures: %+v", row.Stack, row)
			}
			switch row.Stack {
			case "raw", "tcp":
				// The request byte, and nothing else, on top of the data.
				if row.WirePerByte != float64(1<<20+1)/(1<<20) {
					t.Errorf("%s: %v bytes on the wire per byte, want exactly the data and a request byte", row.Stack, row.WirePerByte)
				}
			case "zstd+tcp":
				if row.WirePerByte > 0.5 {
					t.Errorf("zstd sent %.3f bytes on the wire per byte of text", row.WirePerByte)
				}
			}
		}
		if r.Results[0].Stack != "raw" || r.Results[0].Ratio != 1 || r.Results[0].LatencyRatio != 1 {
			t.Errorf("the baseline is not raw TCP at ratio 1: %+v", r.Results[0])
		}
		if len(r.Links) != 4 || r.Links[0].Rate != 10e6 || len(r.Links[0].Goodput) != 3 {
			t.Errorf("want 4 link estimates of 3 stacks, from 10M, got %+v", r.Links)
		}
	})
}

func TestLayers(t *testing.T) {
	code, stdout, _ := runSync("layers")
	if code != base.ExitOK {
		t.Fatalf("exit code %d", code)
	}
	for _, re := range []string{
		`(?m)^zstd \(filter\): .*Zstandard`,
		`(?m)^  level +int +default 3 +range 1\.\.22 `,
		`(?m)^tcp \(factory, terminal\): `,
	} {
		if !regexp.MustCompile(re).MatchString(stdout) {
			t.Errorf("no %q in:\n%s", re, stdout)
		}
	}
}

func TestVersion(t *testing.T) {
	code, stdout, _ := runSync("version")
	if code != base.ExitOK || !regexp.MustCompile(`^vlink \S+.* go1\.\d+`).MatchString(stdout) {
		t.Errorf("exit code %d, output %q", code, stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--listen", "x"}, "before a command"},
		{[]string{"serve", "--bogus"}, "flag provided but not defined"},
		{[]string{"serve", "--target", "127.0.0.1:1", "extra"}, `unexpected argument "extra"`},
		{[]string{"serve", "--allow", "*.corp.example"}, "want HOST:PORTS"},
		{[]string{"serve", "--allow", "10.0.0.1/8:443"}, "did you mean 10.0.0.0/8"},
		{[]string{"serve", "--target", "nohostport"}, "want HOST:PORT"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--layers", "tcp"}, "not a layer a dialer can ask for"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--limit", "zstd.level=9-1"}, "backwards"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--limit", "zstd.speed=1"}, "has no parameter"},
		{[]string{"serve", "--allow", "10.0.0.0/8:*", "--plain", "allow"}, "--plain allow needs --target"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--plain", "maybe"}, "want default, allow or refuse"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--log-level", "verbose"}, "want debug, info, warn or error"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--identity", "id"}, "--identity needs --key-file"},
		{[]string{"key", "--identity", "--node", "db"}, "--identity makes a fresh identity"},
		{[]string{"tunnel"}, "--to HOST:PORT is required"},
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--log-format", "xml"}, "want text or json"},
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--stats", "-1s"}, "--stats want"},
		{[]string{"serve", "--target", "127.0.0.1:1", "--metrics", "9464"}, "--metrics"},
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--via", "127.0.0.1:2"}, "need --stack"},
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--stack", "zstd:level=99"}, "outside [1, 22]"},
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--stack", "brotli"}, "unknown layer"},
		{[]string{"bench", "--data", "zeros"}, "want text, random or both"},
		{[]string{"bench", "--size", "lots"}, "not a size"},
		{[]string{"bench", "--stacks", "tcp,nope"}, "unknown layer"},
		{[]string{"help", "frobnicate"}, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runSync(tc.args...)
			if code != base.ExitUsage {
				t.Errorf("exit code %d, want %d", code, base.ExitUsage)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, stderr)
			}
			if stdout != "" {
				t.Errorf("usage error printed to stdout: %q", stdout)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, c := range program.Commands {
		t.Run(c.Name, func(t *testing.T) {
			for _, args := range [][]string{{c.Name, "--help"}, {c.Name, "-h"}, {"help", c.Name}} {
				code, stdout, stderr := runSync(args...)
				if code != base.ExitOK || stderr != "" {
					t.Errorf("%v: exit code %d, stderr %q", args, code, stderr)
				}
				level := "(default info)"
				if c.Name == "exec" || c.Name == "launch" {
					level = "(default warn)" // the program's stderr is its output
				}
				for _, want := range []string{"Usage: vlink " + c.Name, "Flags:", "--log-level LEVEL", level, "Examples:\n  ", "Exit codes:"} {
					if !strings.Contains(stdout, want) {
						t.Errorf("%v: no %q in:\n%s", args, want, stdout)
					}
				}
			}
		})
	}
	code, stdout, _ := runSync("--help")
	if code != base.ExitOK || !strings.Contains(stdout, "Commands:") {
		t.Errorf("vlink --help: exit code %d:\n%s", code, stdout)
	}
}

// TestUsageFile keeps USAGE.txt equal to the commands' --help; run with
// -update to rewrite it.
func TestUsageFile(t *testing.T) { clitest.UsageFile(t, program) }

// TestBinary checks the real exit codes of the built command.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goTool := testenv.Programs(t, "go")[0]
	bin := filepath.Join(t.TempDir(), "vlink")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout for 0, stderr otherwise
	}{
		{[]string{"--help"}, base.ExitOK, "Commands:"},
		{[]string{"serve", "--help"}, base.ExitOK, "Usage: vlink serve"},
		{[]string{"serve", "--no-such-flag"}, base.ExitUsage, "flag provided but not defined"},
		{[]string{"serve"}, base.ExitUsage, "open proxy"},
		{[]string{"serve", "--listen", "256.0.0.1:1", "--target", "127.0.0.1:1"}, base.ExitFailure, "256.0.0.1"},
	} {
		cmd := exec.Command(bin, tc.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		out := stderr.String()
		if tc.code == base.ExitOK {
			out = stdout.String()
		}
		if code != tc.code || !strings.Contains(out, tc.out) {
			t.Errorf("vlink %s: exit code %d, want %d; output does not say %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.out, out)
		}
	}
}

// With --key-file, dialers without the key and plain connections are
// refused, and the dialer learns why.
func TestServeKeyRequired(t *testing.T) {
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--key-file", writeKey(t))
	srvAddr := srv.addr(t)
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", srvAddr, "--stack", "zstd")
	for _, addr := range []string{tun.addr(t), srvAddr} {
		c, err := net.Dial("tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue // reset before connect returned: closed, as wanted
		}
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("hello"))
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("read %q through %s, want the connection closed", b, addr)
		}
		c.Close()
	}
	tun.stderr.waitFor(t, `msg="cannot reach destination".*authentication required`)
	srv.stderr.waitFor(t, `plain connection refused by policy`)
}

func TestServeWarnsBeyondLoopbackWithoutKey(t *testing.T) {
	srv := start(t, "serve", "--listen", "0.0.0.0:0", "--target", "127.0.0.1:9")
	srv.addr(t)
	srv.stderr.waitFor(t, `level=WARN msg="listening beyond loopback without --key-file`)
	srv.stop(t)
	srv = start(t, "serve", "--listen", "127.0.0.1:0", "--target", "127.0.0.1:9")
	srv.addr(t)
	srv.stop(t)
	if s := srv.stderr.String(); strings.Contains(s, "WARN") {
		t.Errorf("warned on loopback:\n%s", s)
	}
}

// Without --stack, the tunnel follows the user's configuration.
func TestTunnelFollowsConfiguration(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[default]\nstack = \"s2\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(vlink.EnvConfig, cfg)
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--log-level", "debug")
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", srv.addr(t))
	be.handlers <- func(c net.Conn) { io.Copy(c, c) }
	c, err := net.Dial("tcp", tun.addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := testnet.RandomBytes(100<<10, 1)
	go func() {
		c.Write(msg)
		netconn.CloseWrite(c)
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}
	srv.stderr.waitFor(t, `msg=forwarding .*stack=s2 `)
}

// On SIGINT a connection in flight finishes within the grace period,
// while new ones are no longer accepted.
func TestTunnelShutdownLetsConnectionsFinish(t *testing.T) {
	be := newBackend(t)
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", be.addr(), "--stack", "tcp", "--grace", "10s")
	tunAddr := tun.addr(t)
	be.handlers <- func(c net.Conn) { io.Copy(c, c) }
	c, err := net.Dial("tcp", tunAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	// One echo first, so the connection is being relayed before the
	// signal: the grace period is for relays already running.
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	data := testnet.RandomBytes(1<<20, 1)
	got := make(chan [32]byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		got <- sha256.Sum256(b)
	}()
	if _, err := c.Write(data[:len(data)/2]); err != nil {
		t.Fatal(err)
	}
	tun.cancel() // SIGINT
	tun.stderr.waitFor(t, `msg="shutting down" active=1`)
	if nc, err := net.DialTimeout("tcp", tunAddr, time.Second); err == nil {
		nc.Close()
		t.Errorf("a new connection was accepted during shutdown")
	}
	if _, err := c.Write(data[len(data)/2:]); err != nil {
		t.Fatalf("writing during the grace period: %v", err)
	}
	netconn.CloseWrite(c)
	if sum := <-got; sum != sha256.Sum256(data) {
		t.Errorf("the echo differs from what was sent")
	}
	if code := tun.stop(t); code != base.ExitOK {
		t.Errorf("exit code %d; stderr:\n%s", code, tun.stderr.String())
	}
	if s := tun.stderr.String(); strings.Contains(s, "closed connections") {
		t.Errorf("a connection that finished in time was cut:\n%s", s)
	}
}

// TestTunnelSharesMuxSession: a tunnel whose stack has mux carries every
// connection it accepts over one session, hence one TCP connection to
// serve; without mux, each gets its own.
func TestTunnelSharesMuxSession(t *testing.T) {
	echo := testnet.EchoServer(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", echo)
	serveAddr := srv.addr(t)
	for _, tc := range []struct {
		stack string
		want  int32 // TCP connections reaching serve for 5 tunnelled ones
	}{{"mux", 1}, {"zstd+mux", 1}, {"zstd", 5}} {
		t.Run(tc.stack, func(t *testing.T) {
			var conns atomic.Int32
			counter := testnet.Listen(t, func(c net.Conn) {
				conns.Add(1)
				out, err := net.Dial("tcp", serveAddr)
				if err != nil {
					t.Error(err)
					return
				}
				netconn.Relay(c, out)
			})
			tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", counter, "--stack", tc.stack)
			tunAddr := tun.addr(t)
			for i := range 5 {
				c, err := net.Dial("tcp", tunAddr)
				if err != nil {
					t.Fatal(err)
				}
				testnet.RoundTrip(t, c, 100<<10+i)
				c.Close()
			}
			if got := conns.Load(); got != tc.want {
				t.Errorf("%d TCP connections reached serve for 5 through the tunnel, want %d", got, tc.want)
			}
			if code := tun.stop(t); code != base.ExitOK {
				t.Errorf("tunnel exit code %d", code)
			}
		})
	}
}

//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// Timeouts of the harness; generous, since CI machines are shared.
const (
	startTimeout = 15 * time.Second // a process is listening
	stopTimeout  = 5 * time.Second  // a process exits after SIGTERM
)

// A proc is a program started for a test, in its own process group so
// that cleanup reaches its children too (socat forks one per connection).
type proc struct {
	name  string
	cmd   *exec.Cmd
	out   *testnet.Buffer // stdout and stderr
	done  chan struct{}
	err   error // from Wait, once done is closed
	ports []int // listening ports that must be gone after stop

	// wantCleanExit: the program must exit with status 0 on SIGTERM
	// (vlink does, by its contract).
	wantCleanExit bool
	stopOnce      sync.Once
}

// startProc starts a program and registers its cleanup: SIGTERM to the
// group, SIGKILL if it lingers, and a check that its ports are closed.
func startProc(tb testing.TB, name string, args ...string) *proc {
	tb.Helper()
	cmd := exec.Command(name, args...)
	p := &proc{name: filepath.Base(name), cmd: cmd, out: &testnet.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// A descendant that escaped the group must not hold Wait forever.
	cmd.WaitDelay = stopTimeout
	// Pdeathsig: a test binary killed by its timeout takes them along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

func (p *proc) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.cmd.Process.Pid) }

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop ends the process group and checks how the process ended. Only the
// first call does anything; cleanup calls it again.
func (p *proc) stop(tb testing.TB) {
	tb.Helper()
	p.stopOnce.Do(func() { p.doStop(tb) })
}

func (p *proc) doStop(tb testing.TB) {
	tb.Helper()
	pgid := p.cmd.Process.Pid
	exitedEarly := !p.running()
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		tb.Errorf("%s ignored SIGTERM for %v; killing it", p, stopTimeout)
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Children that outlived the leader.
	syscall.Kill(-pgid, syscall.SIGKILL)
	if exitedEarly {
		tb.Errorf("%s exited before the test ended: %v", p, p.err)
	} else if p.wantCleanExit && p.err != nil {
		tb.Errorf("%s on SIGTERM: %v, want exit status 0", p, p.err)
	}
	for _, port := range p.ports {
		if listening(port) {
			tb.Errorf("%s stopped but port %d is still listening", p, port)
		}
	}
	if tb.Failed() {
		tb.Logf("output of %s:\n%s", p, tail(p.out.String(), 6000))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[...]\n" + s[len(s)-n:]
}

// waitFor waits until the output matches re and returns the submatches.
func (p *proc) waitFor(tb testing.TB, re *regexp.Regexp, timeout time.Duration) []string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m
		}
		if !p.running() {
			tb.Fatalf("%s exited (%v) before printing %q; output:\n%s", p, p.err, re, tail(p.out.String(), 4000))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not print %q within %v; output:\n%s", p, re, timeout, tail(p.out.String(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listenAddrRE matches the line vlink serve and vlink tunnel log once
// they listen ("serving", "listening", "tunnel listening").
var listenAddrRE = regexp.MustCompile(`msg=(?:serving|listening|"[^"]*listening") addr=(\S+)`)

// startVLink runs "vlink CMD ARGS" on a free loopback port and returns it
// with the address it listens on.
func startVLink(tb testing.TB, args ...string) (*proc, string) {
	tb.Helper()
	args = append(args, "--listen", "127.0.0.1:0", "--grace", "1s")
	p := startProc(tb, vlinkBin, args...)
	p.name = "vlink " + args[0]
	p.wantCleanExit = true
	addr := p.waitFor(tb, listenAddrRE, startTimeout)[1]
	p.ports = append(p.ports, portOf(tb, addr))
	return p, addr
}

// startHTTPServer serves dir with python3's http.server.
func startHTTPServer(tb testing.TB, dir string) (*proc, string) {
	tb.Helper()
	p := startProc(tb, "python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", dir)
	port, _ := strconv.Atoi(p.waitFor(tb, regexp.MustCompile(`Serving HTTP on \S+ port (\d+)`), startTimeout)[1])
	p.ports = append(p.ports, port)
	waitListening(tb, p, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

// startSocatEcho runs a socat echo server (one cat per connection).
func startSocatEcho(tb testing.TB) (*proc, string) {
	tb.Helper()
	port := freePort(tb)
	p := startProc(tb, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork", port), "EXEC:cat")
	p.ports = append(p.ports, port)
	waitListening(tb, p, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

// startIperf3Server runs an iperf3 server on loopback.
func startIperf3Server(tb testing.TB) (*proc, string) {
	tb.Helper()
	port := freePort(tb)
	p := startProc(tb, "iperf3", "-s", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
	p.ports = append(p.ports, port)
	waitListening(tb, p, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

// freePort returns a loopback port that was free a moment ago, for
// programs that cannot report the port the kernel picked.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func portOf(tb testing.TB, addr string) int {
	tb.Helper()
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// waitListening waits until a socket listens on port. It reads the
// kernel's socket table rather than connecting, which servers such as
// iperf3 would take for a client.
func waitListening(tb testing.TB, p *proc, port int) {
	tb.Helper()
	deadline := time.Now().Add(startTimeout)
	for !listening(port) {
		if !p.running() {
			tb.Fatalf("%s exited (%v) before listening on %d; output:\n%s", p, p.err, port, tail(p.out.String(), 4000))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not listening on %d after %v", p, port, startTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// listening reports whether a TCP socket of this network namespace
// listens on port.
func listening(port int) bool {
	const stateListen = "0A"
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != stateListen {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				return true
			}
		}
	}
	return false
}

// run runs a program to completion, killing its group after timeout.
func run(timeout time.Duration, stdin io.Reader, name string, args ...string) (stdout []byte, stderr string, err error) {
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	cmd.WaitDelay = stopTimeout
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	timer := time.AfterFunc(timeout, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	if !timer.Stop() {
		err = fmt.Errorf("killed after %v: %w", timeout, err)
	}
	return out.Bytes(), errb.String(), err
}

// genData returns n deterministic bytes: 64 KiB runs of generated log
// lines (which compress well) alternating with random bytes (which do
// not), so that compressing stacks take both of their paths.
func genData(n int, seed uint64) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'v', 'l', 'i', 'n', 'k'}))
	const run = 64 << 10
	b := make([]byte, 0, n+512)
	users := []string{"alice", "bob", "carol", "dave", "erin"}
	for len(b) < n {
		end := min(len(b)+run, n)
		if (len(b)/run)%2 == 1 {
			for len(b) < end {
				b = append(b, byte(r.Uint32()))
			}
			continue
		}
		for len(b) < end {
			b = fmt.Appendf(b, "2026-11-22T08:%02d:%02d.%03dZ INFO request id=%d user=%s path=/api/v1/items/%d status=%d took=%dms\n",
				r.IntN(60), r.IntN(60), r.IntN(1000), r.Uint32(), users[r.IntN(len(users))], r.IntN(100000),
				[]int{200, 200, 200, 204, 304, 404, 500}[r.IntN(7)], r.IntN(250))
		}
		b = b[:end]
	}
	return b
}

func fileSum(tb testing.TB, path string) (string, int64) {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// exchange sends data to addr, half-closes, and returns everything the
// peer sent back until it closed.
func exchange(tb testing.TB, addr string, data []byte, timeout time.Duration) ([]byte, error) {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, rerr := io.ReadAll(c)
	if err := <-werr; err != nil {
		return got, fmt.Errorf("writing: %w", err)
	}
	if rerr != nil {
		return got, fmt.Errorf("reading: %w", rerr)
	}
	return got, nil
}

// checkEcho runs exchange and checks that the echo came back intact.
func checkEcho(tb testing.TB, addr string, data []byte) {
	tb.Helper()
	got, err := exchange(tb, addr, data, 60*time.Second)
	if err != nil {
		tb.Fatalf("echo of %d bytes through %s: %v (got %d bytes back)", len(data), addr, err, len(got))
	}
	if len(got) != len(data) || testnet.Sum(got) != testnet.Sum(data) {
		tb.Fatalf("echo through %s: got %d bytes sha256 %.16s, sent %d bytes sha256 %.16s",
			addr, len(got), testnet.Sum(got), len(data), testnet.Sum(data))
	}
}

// waitClosed reads from c until the peer ends the connection and reports
// how many bytes came before the end and how long it took. An orderly
// close (EOF) or a reset are both the end; a read timeout is not.
func waitClosed(c net.Conn, limit time.Duration) (n int64, took time.Duration, err error) {
	start := time.Now()
	c.SetReadDeadline(start.Add(limit))
	n, err = io.Copy(io.Discard, c)
	took = time.Since(start)
	if errors.Is(err, syscall.ECONNRESET) {
		err = nil
	}
	return n, took, err
}

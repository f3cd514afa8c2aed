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
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// Timeouts of the harness; generous, since CI machines are shared.
const (
	startTimeout = realserver.StartTimeout // a process is listening
	stopTimeout  = realserver.StopTimeout  // a process exits after SIGTERM
)

// A proc is a program started for a test (see realserver.Proc).
type proc = realserver.Proc

// startProc starts a program whose whole life the test owns: cleanup
// stops its group and fails the test if it exited early or ignored
// SIGTERM.
func startProc(tb testing.TB, name string, args ...string) *proc {
	tb.Helper()
	p := realserver.Start(tb, name, args...)
	p.Strict = true
	return p
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
	p.Name = "vlink " + args[0]
	p.CleanExit = true
	addr := p.WaitFor(tb, listenAddrRE, startTimeout)[1]
	p.Ports = append(p.Ports, realserver.Port(tb, addr))
	return p, addr
}

// startHTTPServer serves dir with python3's http.server.
func startHTTPServer(tb testing.TB, dir string) (*proc, string) {
	tb.Helper()
	p := startProc(tb, "python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", dir)
	port, _ := strconv.Atoi(p.WaitFor(tb, regexp.MustCompile(`Serving HTTP on \S+ port (\d+)`), startTimeout)[1])
	p.Ports = append(p.Ports, port)
	p.WaitListening(tb, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

// startSocatEcho runs a socat echo server (one cat per connection).
func startSocatEcho(tb testing.TB) (*proc, string) {
	tb.Helper()
	port := realserver.FreePort(tb)
	p := startProc(tb, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork,backlog=128", port), "EXEC:cat")
	p.Ports = append(p.Ports, port)
	p.WaitListening(tb, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
}

// startIperf3Server runs an iperf3 server on loopback.
func startIperf3Server(tb testing.TB) (*proc, string) {
	tb.Helper()
	port := realserver.FreePort(tb)
	p := startProc(tb, "iperf3", "-s", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
	p.Ports = append(p.Ports, port)
	p.WaitListening(tb, port)
	return p, fmt.Sprintf("127.0.0.1:%d", port)
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
	return echoOn(c, data)
}

// echoOn writes data to c, half-closes, and returns everything the peer
// sent back until it closed.
func echoOn(c net.Conn, data []byte) ([]byte, error) {
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

// writeNginxConf writes dir/nginx.conf, an nginx configuration that runs
// in the foreground, logs errors to stderr and keeps its files in dir:
// main holds the main context's lines, server one server block. It
// returns the file's path.
func writeNginxConf(tb testing.TB, dir, main, server string) string {
	tb.Helper()
	conf := fmt.Sprintf(`daemon off;
%[2]s
pid %[1]s/nginx.pid;
error_log stderr;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server {
%[3]s
	}
}
`, dir, main, server)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

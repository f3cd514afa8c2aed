//go:build linux

package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

func sleepMillis(n int) { time.Sleep(time.Duration(n) * time.Millisecond) }

// preloadLab is a far site with real servers behind its firewall and
// vlink serve as its gateway: the host reaches them only through
// "vlink exec --stack zstd --via GATEWAY", and by a name only the site
// resolves.
type preloadLab struct {
	site    *farSite
	serve   *proc
	dir     string // served over HTTP: data.bin, repo.git
	data    []byte
	headRev string // the commit repo.git's main points at
	sshDir  string
}

// Ports of the site's servers.
const (
	farHTTP   = 8000
	farEcho   = 9000
	farClosed = 9999 // nothing listens
	// farBlackHole drops SYNs, once the connect-timeout test made it so
	farBlackHole = 9998
	farRedis     = 6379
	farIperf     = 5201
	farSSH       = 2222
)

func newPreloadLab(t *testing.T) *preloadLab {
	t.Helper()
	testenv.Programs(t, "python3", "socat", "git", "cc") // cc: vlink exec builds its shim
	lab := &preloadLab{site: newFarSite(t), dir: t.TempDir()}
	s := lab.site
	lab.data = genData(8<<20, 11)
	if err := os.WriteFile(filepath.Join(lab.dir, "data.bin"), lab.data, 0o644); err != nil {
		t.Fatal(err)
	}
	lab.makeRepo(t)

	web := s.start(t, "python3", "-u", "-m", "http.server", strconv.Itoa(farHTTP), "--bind", "::", "--directory", lab.dir)
	// backlog: socat listens with a backlog of 5 by default, and when the
	// 32 connections the python client opens at once overflow it, the
	// kernel resets some of them after their first bytes (about 1 run in
	// 10 here): the echo server's failure, which vlink rightly passes on.
	echo := s.start(t, "socat", fmt.Sprintf("TCP6-LISTEN:%d,ipv6only=0,reuseaddr,fork,backlog=128", farEcho), "EXEC:cat")
	s.waitListening(t, web, farHTTP)
	s.waitListening(t, echo, farEcho)
	s.runDNS(t)
	lab.serve = s.start(t, vlinkBin, "serve", "--listen", s.gateway(), "--log-level", "debug", "--grace", "1s",
		"--allow", "*.vlink.test:*", "--allow", s.farIP.String()+":*", "--allow", "["+s.farIP6.String()+"]:*")
	lab.serve.CleanExit = true
	s.waitListening(t, lab.serve, s.gatewayPort)
	return lab
}

// makeRepo makes a bare repository for git's dumb HTTP protocol.
func (lab *preloadLab) makeRepo(t *testing.T) {
	work, bare := t.TempDir(), filepath.Join(lab.dir, "repo.git")
	git := func(dir string, args ...string) string {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=vlink", "-c", "user.email=vlink@test",
			"-c", "init.defaultBranch=main"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git(work, "init", "-q")
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("cloned through vlink exec\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "add", "README")
	git(work, "commit", "-qm", "first")
	lab.headRev = git(work, "rev-parse", "HEAD")
	git(lab.dir, "init", "-q", "--bare", bare)
	git(work, "push", "-q", bare, "HEAD:refs/heads/main")
	git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
	git(bare, "update-server-info")
}

// exec runs PROGRAM ARGS under vlink exec through the site's gateway.
func (lab *preloadLab) exec(t *testing.T, args ...string) (stdout []byte, stderr string, err error) {
	t.Helper()
	full := append([]string{"exec", "--stack", "zstd", "--via", lab.site.gateway(), "--"}, args...)
	return run(2*time.Minute, nil, vlinkBin, full...)
}

func (lab *preloadLab) mustExec(t *testing.T, args ...string) []byte {
	t.Helper()
	out, stderr, err := lab.exec(t, args...)
	if err != nil {
		t.Fatalf("vlink exec %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, realserver.Tail(string(out), 2000), realserver.Tail(stderr, 4000))
	}
	return out
}

// servedThroughGateway waits for vlink serve to log a zstd connection to
// target: the program's bytes went through the stack, not around it.
func (lab *preloadLab) servedThroughGateway(t *testing.T, target string) {
	t.Helper()
	lab.serve.WaitFor(t, regexp.MustCompile(`msg="connection closed" remote=\S+ stack=zstd target=`+regexp.QuoteMeta(target)+` `), 10*time.Second)
}

func (lab *preloadLab) url(path string) string {
	return fmt.Sprintf("http://%s:%d/%s", FarName, farHTTP, path)
}

// TestPreloadPrograms runs unmodified programs from Debian's packages
// under vlink exec against servers they can reach only through the stack.
func TestPreloadPrograms(t *testing.T) {
	testenv.Programs(t, "curl")
	lab := newPreloadLab(t)
	s := lab.site
	want := testnet.Sum(lab.data)

	t.Run("firewall", func(t *testing.T) {
		// Without vlink exec, the name does not resolve (curl's exit code
		// 6, or 28 if the resolver gives up after --max-time) and the
		// site resets every port but the gateway's (7).
		for _, tc := range []struct {
			url   string
			codes []int
		}{
			{lab.url("data.bin"), []int{6, 28}},
			{fmt.Sprintf("http://%s:%d/", s.farIP, farHTTP), []int{7}},
			{fmt.Sprintf("http://[%s]:%d/", s.farIP6, farHTTP), []int{7}},
		} {
			_, stderr, err := run(time.Minute, nil, "curl", "-sS", "--max-time", "10", tc.url)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !slices.Contains(tc.codes, ee.ExitCode()) {
				t.Errorf("curl %s without vlink: %v, want exit status %v: %s", tc.url, err, tc.codes, stderr)
			}
		}
	})

	t.Run("curl", func(t *testing.T) {
		for _, tc := range []struct {
			name, url string
			flags     []string
			remote    func(netip.Addr) bool
			target    string
		}{
			{"ipv4-name", lab.url("data.bin"), []string{"-4"},
				func(a netip.Addr) bool { return netip.MustParsePrefix("198.18.0.0/15").Contains(a) }, fmt.Sprintf("%s:%d", FarName, farHTTP)},
			{"ipv6-name", lab.url("data.bin"), []string{"-6"},
				func(a netip.Addr) bool { return netip.MustParsePrefix("fd76:6c69:6e6b::/96").Contains(a) }, fmt.Sprintf("%s:%d", FarName, farHTTP)},
			{"ipv6-literal", fmt.Sprintf("http://[%s]:%d/data.bin", s.farIP6, farHTTP), []string{"-g"},
				func(a netip.Addr) bool { return a == s.farIP6 }, fmt.Sprintf("[%s]:%d", s.farIP6, farHTTP)},
			{"ipv4-literal", fmt.Sprintf("http://%s:%d/data.bin", s.farIP, farHTTP), nil,
				func(a netip.Addr) bool { return a == s.farIP }, fmt.Sprintf("%s:%d", s.farIP, farHTTP)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "got")
				args := append([]string{"curl", "-sS", "--fail", "-o", out, "-w", "%{remote_ip}"}, tc.flags...)
				remote := string(lab.mustExec(t, append(args, tc.url)...))
				got, n := fileSum(t, out)
				if got != want || n != int64(len(lab.data)) {
					t.Fatalf("curl saved %d bytes sha256 %.16s, want %d bytes %.16s", n, got, len(lab.data), want)
				}
				// curl reads the address back with getpeername: it must
				// be the one it connected to, not the agent's.
				if a, err := netip.ParseAddr(remote); err != nil || !tc.remote(a) {
					t.Errorf("curl's remote_ip is %q", remote)
				}
				lab.servedThroughGateway(t, tc.target)
			})
		}
	})

	t.Run("wget", func(t *testing.T) {
		testenv.Programs(t, "wget")
		out := filepath.Join(t.TempDir(), "got")
		lab.mustExec(t, "wget", "-q", "-O", out, lab.url("data.bin"))
		if got, n := fileSum(t, out); got != want {
			t.Fatalf("wget saved %d bytes sha256 %.16s, want %.16s", n, got, want)
		}
	})

	echoTarget := fmt.Sprintf("%s:%d", FarName, farEcho)
	t.Run("netcat", func(t *testing.T) {
		testenv.Programs(t, "nc")
		data := genData(1<<20, 12)
		full := []string{"exec", "--stack", "zstd", "--via", s.gateway(), "--", "nc", "-N", FarName, strconv.Itoa(farEcho)}
		got, stderr, err := run(time.Minute, strings.NewReader(string(data)), vlinkBin, full...)
		if err != nil || testnet.Sum(got) != testnet.Sum(data) {
			t.Fatalf("nc echoed %d bytes sha256 %.16s (%v), sent %d: %s", len(got), testnet.Sum(got), err, len(data), stderr)
		}
		lab.servedThroughGateway(t, echoTarget)
	})

	t.Run("socat", func(t *testing.T) {
		data := genData(1<<20, 13)
		for _, addr := range []string{"TCP:" + echoTarget, fmt.Sprintf("TCP6:[%s]:%d", s.farIP6, farEcho)} {
			full := []string{"exec", "--stack", "zstd", "--via", s.gateway(), "--", "socat", "-t", "30", "-", addr}
			got, stderr, err := run(time.Minute, strings.NewReader(string(data)), vlinkBin, full...)
			if err != nil || testnet.Sum(got) != testnet.Sum(data) {
				t.Fatalf("socat %s echoed %d bytes (%v), sent %d: %s", addr, len(got), err, len(data), stderr)
			}
		}
	})

	t.Run("python", func(t *testing.T) {
		lab.checkPython(t, lab.mustExec(t, "python3", "testdata/preload_client.py", FarName, strconv.Itoa(farEcho), strconv.Itoa(farClosed)))
	})

	t.Run("python-mux", func(t *testing.T) {
		// Streams of one mux session send their hellos as early data: a
		// blocking connect must still return the far side's refusal, and
		// the program's connects (its forked workers' too: the agent is
		// one process) share one session, as vlink tunnel's do.
		before := len(lab.sessions())
		full := []string{"exec", "--stack", "mux+lz4", "--via", s.gateway(), "--",
			"python3", "testdata/preload_client.py", FarName, strconv.Itoa(farEcho), strconv.Itoa(farClosed)}
		out, stderr, err := run(2*time.Minute, nil, vlinkBin, full...)
		if err != nil {
			t.Fatalf("vlink exec: %v\n%s\n%s", err, out, stderr)
		}
		lab.checkPython(t, out)
		if got := lab.sessions()[before:]; len(got) != 1 {
			t.Errorf("the program's connects came over %d TCP connections to the gateway, want 1: %v", len(got), got)
		}
	})

	t.Run("nginx-workers", func(t *testing.T) {
		// A daemon that drops privileges: nginx's master runs as root and
		// resolves the upstream; its workers, forked as nobody with their
		// environment cleared, make the proxied connections through the
		// stack.
		testenv.Root(t, "for nginx's workers to switch to nobody")
		nginx := testenv.Programs(t, "nginx")[0]
		dir, err := os.MkdirTemp("", "vlink-nginx-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		os.Chmod(dir, 0o755)
		port := realserver.FreePort(t)
		conf := writeNginxConf(t, dir, "user nobody nogroup;\nworker_processes 2;", fmt.Sprintf(
			"\t\tlisten 127.0.0.1:%d;\n\t\tlocation / { proxy_pass http://%s:%d; proxy_buffering off; }", port, FarName, farHTTP))
		p := startProc(t, vlinkBin, "exec", "--stack", "zstd", "--via", s.gateway(), "--",
			nginx, "-e", "stderr", "-p", dir, "-c", conf)
		p.Ports = append(p.Ports, port)
		p.WaitListening(t, port)
		for i := range 4 { // requests spread over both workers
			out := filepath.Join(t.TempDir(), "got")
			_, stderr, err := run(time.Minute, nil, "curl", "-sS", "--fail", "-o", out, fmt.Sprintf("http://127.0.0.1:%d/data.bin", port))
			if err != nil {
				t.Fatalf("curl %d through nginx: %v: %s", i, err, stderr)
			}
			if got, n := fileSum(t, out); got != want {
				t.Fatalf("curl %d through nginx saved %d bytes sha256 %.16s, want %.16s", i, n, got, want)
			}
		}
		lab.servedThroughGateway(t, fmt.Sprintf("%s:%d", FarName, farHTTP))
		if strings.Contains(p.Output(), "refused a shim channel") {
			t.Errorf("the agent refused one of nginx's processes:\n%s", p.Output())
		}
	})

	t.Run("local-address", func(t *testing.T) {
		// A relayed connection's socket is connected to the agent on
		// loopback; getsockname must still give the address on the path
		// to the peer, as without the shim: the host's end of the link.
		script := "import socket,sys\ns=socket.create_connection((sys.argv[1], int(sys.argv[2])))\nprint(s.getsockname()[0], s.getpeername()[0])"
		for _, tc := range []struct{ peer, local netip.Addr }{{s.farIP, s.hostIP}, {s.farIP6, s.hostIP6}} {
			out := strings.Fields(string(lab.mustExec(t, "python3", "-c", script, tc.peer.String(), strconv.Itoa(farEcho))))
			if len(out) != 2 || out[0] != tc.local.String() || out[1] != tc.peer.String() {
				t.Errorf("connected to %s: getsockname, getpeername = %v, want %s %s", tc.peer, out, tc.local, tc.peer)
			}
		}
		lab.servedThroughGateway(t, fmt.Sprintf("[%s]:%d", s.farIP6, farEcho))
	})

	t.Run("names", func(t *testing.T) {
		// A name the far side does not know fails to resolve, as without
		// vlink exec (curl's exit code 6), and one with IPv4 addresses
		// only gets no IPv6 stand-in.
		url := fmt.Sprintf("http://nosuch.vlink.test:%d/", farHTTP)
		_, stderr, err := lab.exec(t, "curl", "-sS", url)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 6 || !strings.Contains(stderr, "Could not resolve host") {
			t.Errorf("curl %s: %v, want exit status 6 (could not resolve host): %s", url, err, stderr)
		}
		script := "import socket,sys\nprint(sorted({a[0].name for a in socket.getaddrinfo(sys.argv[1], int(sys.argv[2]), type=socket.SOCK_STREAM)}))\n" +
			"s=socket.create_connection((sys.argv[1], int(sys.argv[2])))\ns.sendall(b'v4 only')\ns.shutdown(socket.SHUT_WR)\nprint(s.recv(100).decode())"
		out := string(lab.mustExec(t, "python3", "-c", script, FarV4Name, strconv.Itoa(farEcho)))
		if out != "['AF_INET']\nv4 only\n" {
			t.Errorf("python resolving %s (IPv4 only on the far side) and echoing through it:\n%s", FarV4Name, out)
		}
	})

	t.Run("connect-timeout", func(t *testing.T) {
		// A far host that drops SYNs: the program's own connect timeout
		// (13 s) decides, as without vlink, not the gateway's
		// --dial-timeout (10 s), and the gateway's dial stops when the
		// program's vlink exec ends.
		const timeout = 13
		rules := fmt.Sprintf("table inet vlblack {\n chain output {\n  type filter hook output priority 0;\n  tcp dport %d drop\n }\n}\n", farBlackHole)
		cmd := exec.Command("ip", "netns", "exec", s.ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft: %v\n%s", err, out)
		}
		script := "import socket,sys,time\ns=socket.socket()\ns.settimeout(float(sys.argv[3]))\nt=time.monotonic()\n" +
			"try:\n  s.connect((sys.argv[1], int(sys.argv[2])))\n  print('connected')\n" +
			"except OSError as e:\n  print(e, '%.1f' % (time.monotonic()-t))\n"
		out := strings.Fields(string(lab.mustExec(t, "python3", "-c", script, s.farIP.String(), strconv.Itoa(farBlackHole), strconv.Itoa(timeout))))
		ended := time.Now()
		took, _ := strconv.ParseFloat(out[len(out)-1], 64)
		if got := strings.Join(out[:len(out)-1], " "); got != "timed out" || took < timeout-0.5 || took > timeout+2 {
			t.Errorf("a connect with a %d s timeout to a host that drops SYNs: %q after %.1f s; want python's own \"timed out\" after %d s", timeout, got, took, timeout)
		}
		target := regexp.QuoteMeta(fmt.Sprintf("%s:%d", s.farIP, farBlackHole))
		lab.serve.WaitFor(t, regexp.MustCompile(`msg="the dialer left before the target answered" remote=\S+ target=`+target), 10*time.Second)
		if after := time.Since(ended); after > 5*time.Second {
			t.Errorf("the gateway stopped dialing %v after the program's vlink exec ended, want at once", after)
		}
	})

	t.Run("quiet", func(t *testing.T) {
		// The program's stderr is its output: a refused connect shows as
		// the program reports it, with nothing of vlink's besides.
		url := fmt.Sprintf("http://%s:%d/", FarName, farClosed)
		// curl connects non-blocking and reads SO_ERROR once the socket
		// wakes: the far side's refusal is curl's "Failed to connect" (7),
		// as without vlink exec.
		_, stderr, err := lab.exec(t, "curl", "-sS", url)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 || !strings.Contains(stderr, "Couldn't connect to server") {
			t.Fatalf("curl %s: %v, want exit status 7 (couldn't connect, as curl says of a refusal): %s", url, err, stderr)
		}
		if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "curl: (") {
			t.Errorf("stderr is not curl's line alone:\n%s", stderr)
		}
	})

	t.Run("redis", func(t *testing.T) {
		testenv.Programs(t, "redis-server", "redis-cli", "redis-benchmark")
		srv := s.start(t, "redis-server", "--port", strconv.Itoa(farRedis), "--bind", "* -::*", "--protected-mode", "no",
			"--save", "", "--appendonly", "no")
		s.waitListening(t, srv, farRedis)
		port := strconv.Itoa(farRedis)
		if out := lab.mustExec(t, "redis-cli", "-h", FarName, "-p", port, "SET", "greeting", "through vlink"); strings.TrimSpace(string(out)) != "OK" {
			t.Fatalf("SET: %q", out)
		}
		if out := lab.mustExec(t, "redis-cli", "-h", FarName, "-p", port, "GET", "greeting"); strings.TrimSpace(string(out)) != "through vlink" {
			t.Fatalf("GET: %q", out)
		}
		out := lab.mustExec(t, "redis-benchmark", "-h", FarName, "-p", port, "-c", "50", "-n", "20000", "-t", "set,get", "--csv")
		rps := regexp.MustCompile(`(?m)^"(SET|GET)","([0-9.]+)"`).FindAllStringSubmatch(string(out), -1)
		if len(rps) != 2 {
			t.Fatalf("redis-benchmark output:\n%s", out)
		}
		for _, m := range rps {
			t.Logf("%s: %s requests per second through the shim", m[1], m[2])
		}
		info := string(lab.mustExec(t, "redis-cli", "-h", FarName, "-p", port, "INFO", "stats"))
		m := regexp.MustCompile(`total_connections_received:(\d+)`).FindStringSubmatch(info)
		if n, _ := strconv.Atoi(m[1]); m == nil || n < 50+3 {
			t.Errorf("redis saw %v connections, want the benchmark's 50 and the 3 redis-cli ones", m)
		}
	})

	t.Run("iperf3", func(t *testing.T) {
		testenv.Programs(t, "iperf3")
		srv := s.start(t, "iperf3", "-s", "-p", strconv.Itoa(farIperf))
		s.waitListening(t, srv, farIperf)
		for _, extra := range [][]string{{"-P", "4"}, {"-R"}} {
			args := append([]string{"iperf3", "-c", FarName, "-p", strconv.Itoa(farIperf), "-t", "2", "--json"}, extra...)
			out := lab.mustExec(t, args...)
			var r struct {
				Start struct {
					Connected []json.RawMessage `json:"connected"`
				} `json:"start"`
				iperfResult
			}
			if err := json.Unmarshal(out, &r); err != nil || r.Error != "" {
				t.Fatalf("iperf3 %v: %v %s", extra, err, r.Error)
			}
			streams := 1
			if extra[0] == "-P" {
				streams = 4
			}
			if len(r.Start.Connected) != streams || r.End.SumReceived.Bytes <= 0 || r.End.SumSent.Bytes <= 0 {
				t.Errorf("iperf3 %v: %d streams, sent %d, received %d", extra, len(r.Start.Connected), r.End.SumSent.Bytes, r.End.SumReceived.Bytes)
			}
			t.Logf("iperf3 %v: %.2f Gbit/s received", extra, r.End.SumReceived.BitsPerSecond/1e9)
		}
		lab.servedThroughGateway(t, fmt.Sprintf("%s:%d", FarName, farIperf))
	})

	t.Run("ssh", func(t *testing.T) {
		testenv.Programs(t, "ssh", "ssh-keygen")
		sshd := lab.startSSHD(t)
		dir := lab.sshDir
		out := lab.mustExec(t, "ssh", "-F", "/dev/null", "-i", filepath.Join(dir, "id"), "-o", "IdentitiesOnly=yes",
			"-o", "UserKnownHostsFile="+filepath.Join(dir, "known_hosts"), "-o", "StrictHostKeyChecking=yes",
			"-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-p", strconv.Itoa(farSSH), "root@"+FarName,
			"grep", FarName, "/etc/hosts")
		// The far side's /etc/hosts: the command ran there.
		if !strings.Contains(string(out), s.farIP.String()+" "+FarName) {
			t.Errorf("ssh printed %q, want the far side's hosts entry", out)
		}
		_ = sshd
	})

	t.Run("git", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "clone")
		lab.mustExec(t, "git", "clone", "-q", lab.url("repo.git"), dst)
		out, err := exec.Command("git", "-C", dst, "rev-parse", "HEAD").Output()
		if err != nil || strings.TrimSpace(string(out)) != lab.headRev {
			t.Fatalf("the clone's HEAD is %q (%v), want %s", out, err, lab.headRev)
		}
		if b, err := os.ReadFile(filepath.Join(dst, "README")); err != nil || string(b) != "cloned through vlink exec\n" {
			t.Errorf("README: %q %v", b, err)
		}
	})

	t.Run("daemon", func(t *testing.T) {
		// A program that starts a background job and exits at once: vlink
		// exec waits for the job (the agent must outlive it), returns the
		// program's exit code, and the job's connection works.
		out := filepath.Join(t.TempDir(), "got")
		script := fmt.Sprintf("(sleep 0.3; curl -sS -o %s %s) & exit 3", out, lab.url("data.bin"))
		_, stderr, err := lab.exec(t, "sh", "-c", script)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("vlink exec: %v, want exit status 3: %s", err, stderr)
		}
		if got, _ := fileSum(t, out); got != want {
			t.Errorf("the background curl saved sha256 %.16s, want %.16s", got, want)
		}
		if stderr != "" {
			t.Errorf("vlink exec wrote to the program's stderr: %s", stderr)
		}
	})
}

// checkPython checks the output of testdata/preload_client.py.
func (lab *preloadLab) checkPython(t *testing.T, out []byte) {
	t.Helper()
	var r struct {
		Resolved           string `json:"resolved"`
		Peer               string `json:"peer"`
		Blocking           bool   `json:"blocking"`
		TimeoutSocket      bool   `json:"timeout_socket"`
		RefusedBlocking    string `json:"refused_blocking"`
		RefusedNonblocking string `json:"refused_nonblocking"`
		Asyncio            int    `json:"asyncio"`
		Fork               int    `json:"fork"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	if !netip.MustParsePrefix("198.18.0.0/15").Contains(netip.MustParseAddr(r.Resolved)) || r.Peer != r.Resolved {
		t.Errorf("resolved %s, getpeername %s: want the same fake address", r.Resolved, r.Peer)
	}
	if !r.Blocking || !r.TimeoutSocket || r.Asyncio != 32 || r.Fork != 8 {
		t.Errorf("echo: blocking %v, with timeout %v, asyncio %d/32, forked workers %d/8", r.Blocking, r.TimeoutSocket, r.Asyncio, r.Fork)
	}
	if r.RefusedBlocking != "ConnectionRefusedError" {
		t.Errorf("a blocking connect to a closed far port: %s, want ConnectionRefusedError", r.RefusedBlocking)
	}
	if r.RefusedNonblocking != "ConnectionRefusedError" {
		t.Errorf("a non-blocking connect to a closed far port: %s, want ConnectionRefusedError", r.RefusedNonblocking)
	}
}

// sessions lists the remote addresses of the gateway's mux streams, in
// the order its log first names them: one per TCP connection they came
// over. A stream's own hello names the layers above mux: none here, and
// no other route of the lab sends an empty stack.
func (lab *preloadLab) sessions() []string {
	var list []string
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`msg="vlink: accepted" remote=(\S+) stack="" `).FindAllStringSubmatch(lab.serve.Output(), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			list = append(list, m[1])
		}
	}
	return list
}

// startSSHD runs OpenSSH's sshd in the site with fresh keys.
func (lab *preloadLab) startSSHD(t *testing.T) *proc {
	t.Helper()
	progs := testenv.Programs(t, "sshd", "ssh-keygen")
	sshd := progs[0]
	dir := t.TempDir()
	lab.sshDir = dir
	for _, k := range []string{"id", "host"} {
		sh(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", k, "-f", filepath.Join(dir, k))
	}
	pub, _ := os.ReadFile(filepath.Join(dir, "id.pub"))
	hostPub, _ := os.ReadFile(filepath.Join(dir, "host.pub"))
	os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600)
	os.WriteFile(filepath.Join(dir, "known_hosts"), []byte(fmt.Sprintf("[%s]:%d %s", FarName, farSSH, hostPub)), 0o600)
	cfg := fmt.Sprintf(`Port %d
ListenAddress 0.0.0.0
ListenAddress ::
HostKey %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
`, farSSH, filepath.Join(dir, "host"), filepath.Join(dir, "authorized_keys"))
	os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(cfg), 0o600)
	os.MkdirAll("/run/sshd", 0o755) // privilege separation directory
	p := lab.site.start(t, sshd, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	lab.site.waitListening(t, p, farSSH)
	return p
}

// TestExecExitCodes checks what vlink exec returns, and that it refuses
// the programs the shim cannot reach.
func TestExecExitCodes(t *testing.T) {
	testenv.Programs(t, "sh", "cc")
	dir := t.TempDir()
	static := filepath.Join(dir, "static")
	src := filepath.Join(dir, "static.c")
	os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644)
	staticOut, staticErr := exec.Command("cc", "-static", "-o", static, src).CombinedOutput()
	noexec := filepath.Join(dir, "noexec")
	os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644)

	for _, tc := range []struct {
		name   string
		args   []string
		code   int // -N: vlink exec died by signal N, as its program
		stderr string
	}{
		{"exit status", []string{"sh", "-c", "exit 7"}, 7, ""},
		{"killed", []string{"sh", "-c", "kill -KILL $$"}, -9, ""},
		{"not found", []string{"/nonexistent/program"}, 127, "not found"},
		{"not executable", []string{noexec}, 126, "permission denied"},
		{"go program", []string{vlinkBin, "version"}, 125, "a Go program"},
		{"static", []string{static}, 125, "statically linked"},
		{"static bypass", []string{"--allow-bypass", "--", static}, 0, "bypass vlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "static") && staticErr != nil {
				testenv.Missing(t, "needs a static C library (Debian: libc6-dev; %s installs it): cc -static: %v\n%s", testenv.Install, staticErr, staticOut)
			}
			args := append([]string{"exec"}, tc.args...)
			if tc.args[0] != "--allow-bypass" {
				args = append([]string{"exec", "--"}, tc.args...)
			}
			_, stderr, err := run(time.Minute, nil, vlinkBin, args...)
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
				if ws := ee.Sys().(syscall.WaitStatus); ws.Signaled() {
					code = -int(ws.Signal())
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(strings.ToLower(stderr), strings.ToLower(tc.stderr)) {
				t.Errorf("exit code %d, want %d; stderr does not say %q:\n%s", code, tc.code, tc.stderr, stderr)
			}
		})
	}
}

// TestExecCleanup kills the program under vlink exec: vlink exec must
// report it and leave no agent, socket or process behind.
func TestExecCleanup(t *testing.T) {
	testenv.Programs(t, "sleep", "cc") // cc: vlink exec builds its shim
	cmd := exec.Command(vlinkBin, "exec", "--log-level", "debug", "--", "sleep", "60")
	var out testnet.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	var agent string
	for i := 0; agent == "" && i < 1000; i++ {
		if m := regexp.MustCompile(`msg=agent socket=(@\S+)`).FindStringSubmatch(out.String()); m != nil {
			agent = m[1]
		}
		sleepMillis(10)
	}
	if agent == "" {
		t.Fatalf("vlink exec did not log its agent:\n%s", out.String())
	}
	if !strings.Contains(unixSockets(t), agent[1:]) {
		t.Fatalf("the agent's socket %s is not listed in /proc/net/unix", agent)
	}
	var child int
	for i := 0; child == 0 && i < 500; i++ {
		child = childOf(cmd.Process.Pid, "sleep")
		sleepMillis(10)
	}
	if child == 0 {
		t.Fatal("no sleep process under vlink exec")
	}
	syscall.Kill(child, syscall.SIGKILL)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("vlink exec: %v, want killed by SIGKILL, as its program", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("vlink exec did not exit after its program was killed")
	}
	if strings.Contains(unixSockets(t), agent[1:]) {
		t.Errorf("the agent's socket %s outlived vlink exec", agent)
	}
}

func unixSockets(t *testing.T) string {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// childOf returns the pid of a child of parent running comm, or 0.
func childOf(parent int, comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if s[open+1:close] == comm && len(f) > 1 && f[1] == strconv.Itoa(parent) {
			return pid
		}
	}
	return 0
}

// TestExecPlainRule: a rule with tcp's options and no gateway reaches an
// unmodified program's socket (the agent connects by itself and passes
// the socket): Python reads the rule's congestion control and keep-alive
// idle time back from the socket it connected, echoes through it, and a
// refused connect is Python's own ConnectionRefusedError.
func TestExecPlainRule(t *testing.T) {
	testenv.Programs(t, "python3", "cc") // cc: vlink exec builds its shim
	def, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		testenv.Missing(t, "needs Linux's TCP congestion control setting: %v", err)
	}
	cc := "reno" // always built in; the test needs one that is not the default
	if strings.TrimSpace(string(def)) == "reno" {
		cc = "cubic"
	}
	echo := startEcho(t)
	_, port, _ := net.SplitHostPort(echo)
	closed := testnet.RefusedPort(t)
	conf := filepath.Join(t.TempDir(), "vlink.toml")
	rules := fmt.Sprintf("[[route]]\nhost = \"127.0.0.1\"\nports = \"%s,%d\"\nstack = \"tcp:cc=%s,keepalive=7s\"\n", port, closed, cc)
	if err := os.WriteFile(conf, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	// Every connect to the echo server is Python's own, with the rule's
	// options: the agent answers the first, non-blocking, with a direct
	// recipe, by which the shim makes the others alone.
	script := `import select, socket, sys
def check(s):
    cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
    idle = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
    s.sendall(b"through the rule")
    print(cc, idle, s.recv(100).decode())
    s.close()
s = socket.socket()
s.setblocking(False)
s.connect_ex(("127.0.0.1", int(sys.argv[1])))
select.select([], [s], [], 10)
print("nonblocking", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
s.setblocking(True)
check(s)
for i in range(2):
    check(socket.create_connection(("127.0.0.1", int(sys.argv[1]))))
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])))
except ConnectionRefusedError as e:
    print("refused", e.errno)
`
	out, stderr, err := run(time.Minute, nil, vlinkBin, "exec", "--config", conf, "--log-level", "debug", "--",
		"python3", "-c", script, port, strconv.Itoa(closed))
	if err != nil {
		t.Fatalf("vlink exec: %v\n%s", err, stderr)
	}
	line := cc + " 7 through the rule\n"
	if want := fmt.Sprintf("nonblocking 0\n%s%s%srefused %d\n", line, line, line, syscall.ECONNREFUSED); string(out) != want {
		t.Errorf("python printed %q, want %q\nvlink exec said:\n%s", out, want, stderr)
	}
	// Asked once about the echo server, by the non-blocking connect; the
	// closed port's blocking connect is the agent's, which fails.
	if n := strings.Count(stderr, `msg="direct, with the route's options"`); n != 1 || strings.Contains(stderr, "passed a descriptor") {
		t.Errorf("the agent answered %d connects with the route's options, want 1, and passed no descriptor:\n%s", n, stderr)
	}
}

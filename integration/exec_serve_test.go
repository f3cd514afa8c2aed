//go:build linux

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestExecServe runs unmodified servers under "vlink exec --serve": each
// takes plain clients (curl, redis-cli) and VLink clients (vlink tunnel with
// a compressed and a parallel stack) on its own port, with the bytes intact
// and the client's own address where the server looks for it.
func TestExecServe(t *testing.T) {
	testenv.Programs(t, "cc", "curl") // vlink exec builds its shim with cc
	data := genData(8<<20, 7)
	// Not t.TempDir: nginx's workers (nobody) must reach the files.
	dir, err := os.MkdirTemp("", "vlink-exec-serve-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "data.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := testnet.Sum(data)

	// serveUnder runs a server under vlink exec --serve port, and tunnels
	// to it through each VLink stack.
	serveUnder := func(t *testing.T, port int, server ...string) (p *proc, tunnels map[string]string) {
		t.Helper()
		args := []string{"exec", "--serve", strconv.Itoa(port), "--log-level", "debug"}
		if server[0] == "--serve-key-file" {
			args, server = append(args, server[:2]...), server[2:]
		}
		p = startProc(t, vlinkBin, append(append(args, "--"), server...)...)
		p.Ports = append(p.Ports, port)
		p.WaitListening(t, port)
		tunnels = map[string]string{}
		for _, stack := range []string{"zstd", "parallel:streams=4"} {
			tunnelArgs := []string{"tunnel", "--to", fmt.Sprintf("127.0.0.1:%d", port), "--stack", stack}
			if args[len(args)-2] == "--serve-key-file" {
				tunnelArgs = append(tunnelArgs, "--key-file", args[len(args)-1])
			}
			_, addr := startVLink(t, tunnelArgs...)
			tunnels[stack] = addr
		}
		return p, tunnels
	}
	// accepted lists the remote addresses of the VLink clients the agent
	// took in the program's place.
	accepted := func(p *proc) string {
		var b strings.Builder
		for _, m := range regexp.MustCompile(`msg="vlink: accepted" remote=(\S+)`).FindAllStringSubmatch(p.Output(), -1) {
			b.WriteString(m[1] + " ")
		}
		return b.String()
	}
	curlSum := func(t *testing.T, url string) {
		t.Helper()
		out := filepath.Join(t.TempDir(), "got")
		if _, stderr, err := run(time.Minute, nil, "curl", "-sS", "--fail", "-o", out, url); err != nil {
			t.Fatalf("curl %s: %v: %s", url, err, stderr)
		}
		if got, n := fileSum(t, out); got != want {
			t.Fatalf("curl %s saved %d bytes sha256 %.16s, want %.16s", url, n, got, want)
		}
	}

	t.Run("nginx", func(t *testing.T) {
		// Event-driven (epoll), forked workers that each listen on their
		// own SO_REUSEPORT socket, as nobody when run as root; deferred
		// (TCP_DEFER_ACCEPT), which must not hold plain clients back.
		nginx := testenv.Programs(t, "nginx")[0]
		port := realserver.FreePort(t)
		user := ""
		if testenv.IsRoot() {
			user = "user nobody nogroup;"
		}
		conf := writeNginxConf(t, dir, user+"\nworker_processes 2;", fmt.Sprintf(
			"\t\tlisten 127.0.0.1:%d reuseport deferred;\n\t\troot %s;\n\t\tlocation = /peer { return 200 \"$remote_addr:$remote_port\"; }", port, dir))
		p, tunnels := serveUnder(t, port, nginx, "-e", "stderr", "-p", dir, "-c", conf)
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		for range 3 {
			curlSum(t, base+"/data.bin")
		}
		// A plain client: nginx sees curl's own address.
		out, stderr, err := run(time.Minute, nil, "curl", "-sS", "--fail", "-w", " %{local_port} %{time_total}", base+"/peer")
		if err != nil {
			t.Fatalf("curl /peer: %v: %s", err, stderr)
		}
		f := strings.Fields(string(out))
		if len(f) != 3 || f[0] != "127.0.0.1:"+f[1] {
			t.Errorf("nginx saw a plain client as %s, want curl's 127.0.0.1:<its port>", out)
		}
		// The private port's connection never carries a plain client's
		// bytes: TCP_DEFER_ACCEPT there would hold it back a second or
		// more (it did, before the shim stopped passing it on).
		if took, _ := strconv.ParseFloat(f[len(f)-1], 64); took >= 0.9 {
			t.Errorf("a plain request took %.2f s: held back by TCP_DEFER_ACCEPT?", took)
		}
		for stack, addr := range tunnels {
			for range 3 {
				curlSum(t, "http://"+addr+"/data.bin")
			}
			out, stderr, err := run(time.Minute, nil, "curl", "-sS", "--fail", "http://"+addr+"/peer")
			if err != nil {
				t.Fatalf("curl /peer through %s: %v: %s", stack, err, stderr)
			}
			if !strings.Contains(accepted(p), string(out)+" ") {
				t.Errorf("nginx saw a %s client as %s, not as the agent accepted it: %s", stack, out, accepted(p))
			}
		}
		if strings.Contains(p.Output(), "refused a shim channel") {
			t.Errorf("the agent refused one of nginx's processes:\n%s", p.Output())
		}
		// Each worker's SO_REUSEPORT socket listens behind the agent's one.
		if !regexp.MustCompile(`a socket of the program listens.* sockets=2`).MatchString(p.Output()) {
			t.Errorf("the agent did not hand clients to both workers' sockets:\n%s", p.Output())
		}
	})

	t.Run("python", func(t *testing.T) {
		// Threads, one per connection (http.server's ThreadingHTTPServer).
		testenv.Programs(t, "python3")
		port := realserver.FreePort(t)
		_, tunnels := serveUnder(t, port, "python3", "-u", "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1", "--directory", dir)
		curlSum(t, fmt.Sprintf("http://127.0.0.1:%d/data.bin", port))
		for _, addr := range tunnels {
			curlSum(t, "http://"+addr+"/data.bin")
		}
	})

	t.Run("key", func(t *testing.T) {
		// With a key, VLink clients must prove it; plain ones still reach
		// the server, as they would without vlink exec.
		testenv.Programs(t, "python3")
		port := realserver.FreePort(t)
		key := filepath.Join(t.TempDir(), "key")
		if _, stderr, err := run(time.Minute, nil, vlinkBin, "key", "--out", key); err != nil {
			t.Fatalf("vlink key: %v: %s", err, stderr)
		}
		_, tunnels := serveUnder(t, port, "--serve-key-file", key, "python3", "-u", "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1", "--directory", dir)
		curlSum(t, fmt.Sprintf("http://127.0.0.1:%d/data.bin", port))
		curlSum(t, "http://"+tunnels["zstd"]+"/data.bin")
		keyless, addr := startVLink(t, "tunnel", "--to", fmt.Sprintf("127.0.0.1:%d", port), "--stack", "zstd")
		if _, _, err := run(time.Minute, nil, "curl", "-sS", "--fail", "-o", "/dev/null", "http://"+addr+"/data.bin"); err == nil {
			t.Errorf("a VLink client without the key got through")
		}
		keyless.WaitFor(t, regexp.MustCompile(`pre-shared key`), 10*time.Second)
	})

	t.Run("redis", func(t *testing.T) {
		// One thread, its own event loop (ae over epoll).
		testenv.Programs(t, "redis-server", "redis-cli")
		port := realserver.FreePort(t)
		p, tunnels := serveUnder(t, port, "redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no")
		value := strings.Repeat("vlink-", 200000)
		cli := func(port string, stdin string, args ...string) string {
			t.Helper()
			out, stderr, err := run(time.Minute, strings.NewReader(stdin), "redis-cli", append([]string{"-p", port}, args...)...)
			if err != nil {
				t.Fatalf("redis-cli -p %s %s: %v: %s", port, args[0], err, stderr)
			}
			return strings.TrimSpace(string(out))
		}
		cli(strconv.Itoa(port), value, "-x", "SET", "k") // a plain client
		for stack, addr := range tunnels {
			_, tport, _ := strings.Cut(addr, ":")
			if got := cli(tport, "", "GET", "k"); got != value {
				t.Errorf("GET through %s: %d bytes, want the %d set", stack, len(got), len(value))
			}
			info := cli(tport, "", "CLIENT", "INFO")
			m := regexp.MustCompile(`addr=(\S+)`).FindStringSubmatch(info)
			if m == nil || !strings.Contains(accepted(p), m[1]+" ") {
				t.Errorf("redis saw a %s client as %q, not as the agent accepted it: %s", stack, info, accepted(p))
			}
		}
	})
}

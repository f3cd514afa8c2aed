//go:build linux

package integration

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestTunnelEventLoop: a plain tunnel to an IP address runs on its event
// loop (netconn/evloop), which carries short echoes and, moved to the
// splicing relay, bulk ones whole, many at once; a name, or
// --event-loop=false, keeps the goroutines.
func TestTunnelEventLoop(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	port := echo[strings.LastIndexByte(echo, ':')+1:]
	dir := t.TempDir()
	direct, refuse := filepath.Join(dir, "direct.toml"), filepath.Join(dir, "refuse.toml")
	writeFile(t, direct, "# every destination direct\n")
	writeFile(t, refuse, "[default]\naction = \"refuse\"\n")
	for _, tc := range []struct {
		name   string
		args   []string
		loop   bool
		config string // VLINK_CONFIG; "": direct
	}{
		{"tcp to an IP address", []string{"--to", echo, "--stack", "tcp"}, true, ""},
		{"tcp with parameters", []string{"--to", echo, "--stack", "tcp:nodelay=false,keepalive=1m"}, true, ""},
		{"tcp from a port range", []string{"--to", echo, "--stack", "tcp:ports=47100-47199"}, false, ""},
		{"event loop off", []string{"--to", echo, "--stack", "tcp", "--event-loop=false"}, false, ""},
		{"a name", []string{"--to", "localhost:" + port, "--stack", "tcp"}, false, ""},
		{"no --stack, a direct route", []string{"--to", echo}, true, direct},
		{"no --stack, a refusing route", []string{"--to", echo}, false, refuse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := tc.config
			if config == "" {
				config = direct
			}
			t.Setenv("VLINK_CONFIG", config)
			tun, addr := startVLink(t, append([]string{"tunnel"}, tc.args...)...)
			if got := strings.Contains(tun.Output(), "event_loop=true"); got != tc.loop {
				t.Fatalf("event loop %v, want %v:\n%s", got, tc.loop, tun.Output())
			}
			if tc.config == refuse {
				return
			}
			echoMany(t, addr, "")
			if !tun.Running() {
				t.Fatalf("the tunnel exited:\n%s", tun.Output())
			}
		})
	}
}

// TestServeEventLoop: an unkeyed vlink serve takes the hellos it can
// answer from their bytes alone on its event loop (a tcp route's, vlink
// exec's) and hands every other connection to its listener: tunnels with
// tcp and zstd through it carry short and bulk echoes whole, many at
// once, and a program under vlink exec gets its echoes (the shim makes
// the later ones from the agent's recipe) and its own ECONNREFUSED
// through the loop. A key, or --event-loop=false, keeps the
// goroutines, with the same results.
func TestServeEventLoop(t *testing.T) {
	testenv.Programs(t, "socat", "python3", "cc") // cc: vlink exec builds its shim
	_, echo := startSocatEcho(t)
	_, echoPort, _ := net.SplitHostPort(echo)
	closed := strconv.Itoa(testnet.RefusedPort(t))
	keyFile := filepath.Join(t.TempDir(), "vlink.key")
	writeFile(t, keyFile, "0123456789abcdef0123456789abcdef\n")
	// Three connects to the echo: the agent makes the first, the shim
	// the others from the agent's recipe (preload/recipe.go).
	script := `import socket, sys
for i in range(3):
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"through the gateway %d" % i)
    print(s.recv(100).decode())
    s.close()
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])))
except ConnectionRefusedError as e:
    print("refused", e.errno)
`
	for _, tc := range []struct {
		name string
		key  []string
		args []string
		loop bool
	}{
		{"unkeyed", nil, nil, true},
		{"event loop off", nil, []string{"--event-loop=false"}, false},
		{"keyed", []string{"--key-file", keyFile}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--allow", echo, "--allow", "localhost:" + echoPort, "--allow", "127.0.0.1:" + closed, "--log-level", "debug"}, tc.key...)
			serve, gw := startVLink(t, append(args, tc.args...)...)
			if got := strings.Contains(serve.Output(), "event_loop=true"); got != tc.loop {
				t.Fatalf("event loop %v, want %v:\n%s", got, tc.loop, serve.Output())
			}
			for _, stack := range []string{"tcp", "zstd"} {
				tun, addr := startVLink(t, append([]string{"tunnel", "--to", echo, "--via", gw, "--stack", stack}, tc.key...)...)
				echoMany(t, addr, stack+": ")
				tun.Stop(t)
			}
			// A target by name is resolved on a goroutine: the loop
			// passes the hello on, and it is accepted (and logged) once.
			tun, addr := startVLink(t, append([]string{"tunnel", "--to", "localhost:" + echoPort, "--via", gw, "--stack", "tcp"}, tc.key...)...)
			echoMany(t, addr, "tcp to a name: ")
			tun.Stop(t)
			byName := regexp.MustCompile(`msg="vlink: accepted" [^\n]*target=localhost:`+echoPort+`\b[^\n]*`).FindAllString(serve.Output(), -1)
			if len(byName) != 20 || strings.Contains(strings.Join(byName, "\n"), "quick=true") {
				t.Errorf("serve logged %d hellos to localhost:%s as accepted, want 20, none taken on the loop:\n%s", len(byName), echoPort, strings.Join(byName, "\n"))
			}
			conf := filepath.Join(t.TempDir(), "vlink.toml")
			rules := fmt.Sprintf("[[route]]\nhost = \"127.0.0.1\"\nports = \"%s,%s\"\nstack = \"tcp\"\nvia = %q\n", echoPort, closed, gw)
			if tc.key != nil {
				rules = fmt.Sprintf("key_file = %q\n", keyFile) + rules
			}
			writeFile(t, conf, rules)
			out, stderr, err := run(time.Minute, nil, vlinkBin, "exec", "--log-level", "debug", "--config", conf, "--", "python3", "-c", script, echoPort, closed)
			if want := fmt.Sprintf("through the gateway 0\nthrough the gateway 1\nthrough the gateway 2\nrefused %d\n", syscall.ECONNREFUSED); err != nil || string(out) != want {
				t.Errorf("python printed %q, %v; want %q\nvlink exec said:\n%s", out, err, want, stderr)
			}
			// With no key the agent sends a recipe with its one
			// descriptor; with a key, none, and it makes all three.
			recipes := regexp.MustCompile(`msg="passed a descriptor" [^\n]*recipe=true`).FindAllString(string(stderr), -1)
			passed := regexp.MustCompile(`msg="passed a descriptor"`).FindAllString(string(stderr), -1)
			if want := map[bool][2]int{false: {1, 1}, true: {0, 3}}[tc.key != nil]; len(recipes) != want[0] || len(passed) != want[1] {
				t.Errorf("the agent passed %d descriptors, %d with a recipe; want %d, %d\n%s", len(passed), len(recipes), want[1], want[0], stderr)
			}
			// 20 tcp tunnel connections and the program's echoes; the
			// refusal is logged as the target's.
			quick := regexp.MustCompile(`msg="vlink: accepted" [^\n]*quick=true`).FindAllString(serve.Output(), -1)
			if !tc.loop && len(quick) > 0 {
				t.Errorf("serve took %d hellos on its loop, want none", len(quick))
			}
			if tc.loop && len(quick) != 24 {
				t.Errorf("serve took %d hellos on its loop, want 24 (20 tcp tunnel connections, the program's four connects)", len(quick))
			}
			serve.WaitFor(t, regexp.MustCompile(`msg="target unreachable" [^\n]*target=127.0.0.1:`+closed), 10*time.Second)
			if !serve.Running() {
				t.Fatalf("serve exited:\n%s", serve.Output())
			}
		})
	}
}

// echoMany runs 20 echoes through addr at once, 4 of them of 3 MiB (past
// the event loop's 64 KiB: moved to the splicing relay), and checks each
// comes back whole; what names the case in the errors.
func echoMany(t *testing.T, addr, what string) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 100
			if i%5 == 0 {
				n = 3 << 20
			}
			data := genData(n, uint64(i))
			got, err := exchange(t, addr, data, time.Minute)
			if err != nil || testnet.Sum(got) != testnet.Sum(data) {
				t.Errorf("%secho of %d bytes: got %d back, intact %v, err %v", what, n, len(got), testnet.Sum(got) == testnet.Sum(data), err)
			}
		}()
	}
	wg.Wait()
}

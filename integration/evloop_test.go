//go:build linux

package integration

import (
	"path/filepath"
	"strings"
	"sync"
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
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 100
					if i%5 == 0 {
						n = 3 << 20 // past the loop's 64 KiB: moved to the splicing relay
					}
					data := genData(n, uint64(i))
					got, err := exchange(t, addr, data, time.Minute)
					if err != nil || testnet.Sum(got) != testnet.Sum(data) {
						t.Errorf("echo of %d bytes: got %d back, intact %v, err %v", n, len(got), testnet.Sum(got) == testnet.Sum(data), err)
					}
				}()
			}
			wg.Wait()
			if !tun.Running() {
				t.Fatalf("the tunnel exited:\n%s", tun.Output())
			}
		})
	}
}

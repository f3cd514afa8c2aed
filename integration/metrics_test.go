//go:build linux

package integration

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestExecMetrics runs curl under vlink exec --metrics with a rule that
// routes two ports through a gateway, one of them closed there; the
// program scrapes the metrics itself and must find its connects counted
// by how the agent answered them.
func TestExecMetrics(t *testing.T) {
	testenv.Programs(t, "sh", "curl", "python3", "cc") // cc: vlink exec builds its shim
	web, _ := webFile(t, 1<<20)
	_, webPort := splitPort(t, web)
	closed := testnet.RefusedPort(t)
	_, gw := startVLink(t, "serve", "--allow", fmt.Sprintf("127.0.0.1:%s,%d", webPort, closed))
	config := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(config, []byte(fmt.Sprintf(`
[[route]]
host = "127.0.0.1"
ports = "%s,%d"
stack = "zstd"
via = "%s"
`, webPort, closed, gw)), 0o644)
	metrics := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
	script := fmt.Sprintf(`curl -sS --fail -o /dev/null http://%s/data.bin || exit 1
curl -s -o /dev/null http://127.0.0.1:%d/ && exit 2
curl -sS --fail http://%s/metrics`, web, closed, metrics)
	out, stderr, err := run(time.Minute, nil, vlinkBin, "exec", "--config", config, "--metrics", metrics, "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("vlink exec: %v; stderr:\n%s", err, stderr)
	}
	for outcome, want := range map[string]int{"routed": 1, "failed": 1} {
		re := regexp.MustCompile(`(?m)^vlink_exec_connects_total\{outcome="` + outcome + `"\} (\d+)$`)
		m := re.FindStringSubmatch(string(out))
		if m == nil {
			t.Errorf("no %s connects in the metrics:\n%s", outcome, out)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n != want {
			t.Errorf("%s connects: %d, want %d", outcome, n, want)
		}
	}
}

// TestSnapshotOnSIGUSR1 sends SIGUSR1 to a tunnel carrying a connection:
// it must log a snapshot naming the connection, its forward and
// transport, and its bytes so far, and keep running.
func TestSnapshotOnSIGUSR1(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	tun, addr := startVLink(t, "tunnel", "--to", echo, "--stack", "tcp")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	data := genData(100000, 31)
	go c.Write(data)
	if _, err := io.ReadFull(c, make([]byte, len(data))); err != nil { // the connection stays open
		t.Fatalf("echo: %v", err)
	}
	// The bytes down are what the client acknowledged, which a delayed
	// ACK can hold back a moment: ask again until they are all there.
	local := regexp.QuoteMeta(c.LocalAddr().String())
	line := regexp.MustCompile(`msg="open connection" remote=` + local + ` listen=\S+ to=\S+ stack=plain forward=127\.0\.0\.1:0 transport=tcp age=\S+ bytes_up=100000 bytes_down=100000`)
	for deadline := time.Now().Add(5 * time.Second); !line.MatchString(tun.Output()); {
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot of the open connection with its 100000 bytes each way:\n%s", tun.Output())
		}
		if err := tun.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !regexp.MustCompile(`msg=snapshot over=\S+ open=1 new=1 closed=0 failed=0`).MatchString(tun.Output()) {
		t.Errorf("no snapshot summary:\n%s", tun.Output())
	}
	if !tun.Running() {
		t.Fatalf("the tunnel exited on SIGUSR1")
	}
}

// TestHangupWithoutForwards: SIGHUP to serve and tunnel started with
// flags only reads again what their forward was made from (key files,
// the routing configuration) and, nothing having changed, keeps it;
// socks logs it and ignores it. Its default action would kill them; each
// still carries connections after it.
func TestHangupWithoutForwards(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	serve, gw := startVLink(t, "serve", "--target", echo)
	tun, addr := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd")
	socks, _ := startVLink(t, "socks")
	for _, p := range []*proc{serve, tun, socks} {
		if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		want := `msg=reloaded from="the command line" running=1 unchanged=1 started=0 stopped=0`
		if p == socks {
			want = `msg="SIGHUP ignored: started without --forwards`
		}
		p.WaitFor(t, regexp.MustCompile(regexp.QuoteMeta(want)), startTimeout)
		if !p.Running() {
			t.Fatalf("%s exited on SIGHUP:\n%s", p.Name, p.Output())
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := echoOn(c, []byte("after SIGHUP")); err != nil || string(got) != "after SIGHUP" {
		t.Fatalf("echo through tunnel and serve after SIGHUP: %q, %v", got, err)
	}
}

// TestBytesWhileTheyMove scrapes serve's --metrics during a transfer that
// lasts seconds: vlink_bytes_total counts the bytes as they cross (read
// from the kernel at each scrape), not only when the connection ends, so
// that rate() works on the long transfers vlink carries.
func TestBytesWhileTheyMove(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	metrics := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
	_, gw := startVLink(t, "serve", "--target", echo, "--metrics", metrics)
	_, addr := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go io.Copy(io.Discard, c)
	go func() { // 256 KiB every 50 ms, until the test ends
		chunk := genData(256<<10, 5)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	scrape := func() (up float64, open string) {
		t.Helper()
		out, _, err := run(10*time.Second, nil, "curl", "-sS", "--fail", "http://"+metrics+"/metrics")
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		if m := regexp.MustCompile(`(?m)^vlink_bytes_total\{direction="up",forward="[^"]+",stack="zstd",transport="tcp"\} (\S+)$`).FindSubmatch(out); m != nil {
			up, _ = strconv.ParseFloat(string(m[1]), 64)
		}
		if m := regexp.MustCompile(`(?m)^vlink_connections_open\{forward="[^"]+",stack="zstd",transport="tcp"\} (\S+)$`).FindSubmatch(out); m != nil {
			open = string(m[1])
		}
		return up, open
	}
	time.Sleep(time.Second)
	first, open1 := scrape()
	time.Sleep(time.Second)
	second, open2 := scrape()
	if open1 != "1" || open2 != "1" {
		t.Fatalf("connections open at the scrapes: %q, %q; want the one in progress", open1, open2)
	}
	if first < 1<<20 || second < first+1<<20 {
		t.Errorf("bytes up at 1 s and 2 s into the transfer: %.0f, %.0f; want over 1 MiB, then over 1 MiB more", first, second)
	}
}

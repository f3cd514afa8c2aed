//go:build linux

package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/lab"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// A routeCell is a cell of the best-effort matrix: a reaches b's servers
// through fw, by a config route that tries direct, then ssh to b's sshd.
type routeCell struct {
	name string
	fw   *lab.Firewall // nil: a plain router
	way  string        // the way that must win: "direct" or "ssh"
}

var routeCells = []routeCell{
	{name: "h: only outbound SSH allowed", fw: &lab.Firewall{Trust: []string{"b"}, Open: []string{"tcp/22"}}, way: "ssh"},
	{name: "i: reachable directly", way: "direct"},
}

// TestReachBestEffort is the best-effort part of the reach matrix, real
// processes in network namespaces: on b, OpenSSH's sshd on port 22 and
// three socat servers on b's address (echo, a file to download,
// sha256sum of an upload); on a, a config whose route for b races
// try = ["direct", "ssh:host=b..."]. In each cell, vlink route (twice:
// the second dial must take the way the first learnt) says which way
// won and how long it took, and then a SOCKS client of vlink socks (no
// stack: the config decides) moves 8 MiB each way, checked by SHA-256,
// with socks logging the way of every connection. Where fw drops
// everything but SSH, the direct way black-holes its SYNs: it must cost
// the winner no more than the stagger; where b is reachable, direct
// must win at once, never a slower way.
func TestReachBestEffort(t *testing.T) {
	lab.Require(t, "nft", "socat", "sshd")
	dir := t.TempDir()
	download := filepath.Join(dir, "download")
	if err := os.WriteFile(download, testnet.RandomBytes(8<<20, 41), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, cell := range routeCells {
		t.Run(cell.name, func(t *testing.T) {
			rows = append(rows, routeInLab(t, cell, download))
		})
	}
	t.Logf("best-effort matrix (connect: vlink route's first dial, from the start to the way connected; second: the next dial, which starts with the winner):\n%-30s %-7s %-10s %-10s %s\n%s",
		"cell", "way", "connect", "second", "bytes", strings.Join(rows, "\n"))
}

func routeInLab(t *testing.T, cell routeCell, download string) string {
	l := lab.New(t, lab.Topology{
		Name:    "route",
		Hosts:   []lab.Host{{Name: "a"}, {Name: "fw", Firewall: cell.fw}, {Name: "b"}},
		Links:   []lab.Link{{A: "a", B: "fw"}, {A: "fw", B: "b"}},
		Sysctls: lab.TCPSysctls,
	})
	b := l.Addr("b").String()
	if cell.fw != nil {
		checkUnreachable(t, l, "a", "b", "fw")
	}
	sshd := realserver.PrepareSSHD(t, realserver.SSHDOptions{Forwarding: true}, b, 22)
	sp := labProc(t, l, "b", sshd.Program, "-D", "-e", "-f", sshd.ConfigFile)
	waitLabListening(t, l, sp, "b", 22)
	labServers(t, l, "b", b, download)

	ssh := fmt.Sprintf("ssh:host=%s,port=22,user=%s,identity=%s,known-hosts=%s,config=none,agent=false",
		b, sshd.User, sshd.UserKey.Private, sshd.KnownHosts)
	config := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("[[route]]\nhost = %q\ntry = [\"direct\", %q]\n", b, ssh)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VLINK_CONFIG", config)
	want := "direct"
	if cell.way == "ssh" {
		want = ssh
	}

	// vlink route, twice in one process.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := l.CommandContext(ctx, "a", vlinkBin, "route", "--count", "2", b+":7300").CombinedOutput()
	if err != nil {
		t.Fatalf("vlink route: %v\n%s", err, out)
	}
	connected := regexp.MustCompile(`(?m)^connected in (\S+) by (\S+)$`).FindAllStringSubmatch(string(out), -1)
	if len(connected) != 2 || connected[0][2] != cell.way || connected[1][2] != cell.way {
		t.Fatalf("vlink route: want two dials by %s:\n%s", cell.way, out)
	}
	first, _ := time.ParseDuration(connected[0][1])
	second, _ := time.ParseDuration(connected[1][1])
	dials := strings.SplitN(string(out), "dial 2 of 2", 2)
	switch cell.way {
	case "ssh":
		// direct black-holed: stopped when ssh won, which started after
		// the stagger and not later.
		if !regexp.MustCompile(`(?m)^\s+1\s+direct\s+\S+\s+\S+\s+stopped: another way won`).MatchString(dials[0]) ||
			!regexp.MustCompile(`(?m)^\s+2\s+ssh\s+25\d(\.\d)?ms\s+\S+\s+connected, taken`).MatchString(dials[0]) {
			t.Fatalf("first dial: want direct stopped and ssh started at 250ms and taken:\n%s", out)
		}
		if first > 250*time.Millisecond+2*time.Second {
			t.Fatalf("the ssh way connected after %v: the black-holed way delayed it", first)
		}
		if !regexp.MustCompile(`(?m)^\s+1\s+ssh\s+\S+\s+\S+\s+connected, taken\s+won last time`).MatchString(dials[1]) {
			t.Fatalf("second dial: want ssh first, taken, as last time's winner:\n%s", out)
		}
	case "direct":
		if !regexp.MustCompile(`(?m)^\s+1\s+direct\s+\S+\s+\S+\s+connected, taken`).MatchString(dials[0]) ||
			!regexp.MustCompile(`(?m)^\s+2\s+ssh\s+-\s+-\s+not needed`).MatchString(dials[0]) {
			t.Fatalf("first dial: want direct taken at once, ssh never started:\n%s", out)
		}
	}

	// The application: a SOCKS client of vlink socks, which follows the
	// config.
	socksProc := labProc(t, l, "a", vlinkBin, "socks", "--listen", "127.0.0.1:1080", "--log-level", "debug", "--grace", "1s")
	socksProc.CleanExit = true
	waitLabListening(t, l, socksProc, "a", 1080)
	client, err := socks.New(socks.Options{Version: socks.V5, Proxy: "127.0.0.1:1080"})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(port int) net.Conn {
		t.Helper()
		c, err := client.DialContext(ctx, "tcp", fmt.Sprintf("%s:%d", b, port), l.Dialer("a"))
		if err != nil {
			t.Fatalf("SOCKS5 to b:%d: %v\nsocks:\n%s", port, err, realserver.Tail(socksProc.Output(), 3000))
		}
		c.SetDeadline(time.Now().Add(time.Minute))
		return c
	}
	bothWays(t, dial, download)
	ways := regexp.MustCompile(`msg=connection .* way=(\S+|"[^"]*")`).FindAllStringSubmatch(socksProc.Output(), -1)
	if len(ways) != 2 {
		t.Fatalf("socks logged %d connections with their way, want 2:\n%s", len(ways), realserver.Tail(socksProc.Output(), 3000))
	}
	for _, w := range ways {
		if strings.Trim(w[1], `"`) != want {
			t.Fatalf("a connection went by %s, want %s", w[1], cell.way)
		}
	}

	// An unmodified program: vlink exec follows the config too.
	ex := l.CommandContext(ctx, "a", vlinkBin, "exec", "--log-level", "debug", "--", "socat", "-", "TCP:"+b+":7300")
	ex.Stdin = strings.NewReader("hello through the best way\n")
	var stderr strings.Builder
	ex.Stderr = &stderr
	got, err := ex.Output()
	if err != nil || string(got) != "hello through the best way\n" {
		t.Fatalf("vlink exec socat: %q, %v\n%s", got, err, stderr.String())
	}
	if !regexp.MustCompile(`msg="best effort" to=\S+ way=("?)` + regexp.QuoteMeta(want) + `("?)\n`).MatchString(stderr.String()) {
		t.Fatalf("vlink exec's agent did not log the way %s:\n%s", cell.way, stderr.String())
	}
	return fmt.Sprintf("%-30s %-7s %-10v %-10v 8 MiB each way, SHA-256 checked; vlink exec socat", cell.name, cell.way, first, second)
}

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/internal/cli/clitest"
	"github.com/vlink-dev/vlink/internal/lab"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runSync(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelp(t *testing.T) {
	code, out, _ := runSync("--help")
	if code != exitOK || !strings.Contains(out, "Usage:") {
		t.Fatalf("--help: %d\n%s", code, out)
	}
	for _, c := range program.Commands {
		if !strings.Contains(out, "  "+c.Name+" ") {
			t.Errorf("top-level help does not list %s", c.Name)
		}
		for _, args := range [][]string{{c.Name, "--help"}, {"help", c.Name}, {c.Name, "-h"}} {
			code, out, errOut := runSync(args...)
			if code != exitOK || !strings.HasPrefix(out, "Usage: vlink-lab "+c.Name) || !strings.Contains(out, "Exit codes:") || errOut != "" {
				t.Errorf("%v: exit %d, stdout\n%s\nstderr %s", args, code, out, errOut)
			}
		}
	}
	if _, out, _ := runSync("up", "--help"); strings.Contains(out, "ready-fd") {
		t.Error("up --help shows the internal --ready-fd flag")
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--detach", "up"}, "given before a command"},
		{[]string{"help", "frobnicate"}, "unknown command"},
		{[]string{"up"}, "want one PROFILE or FILE"},
		{[]string{"up", "a", "b"}, "want one PROFILE or FILE"},
		{[]string{"up", "nosuchprofile"}, "neither a profile"},
		{[]string{"up", "--bogus", "lan"}, "flag provided but not defined"},
		{[]string{"exec"}, "want HOST and COMMAND"},
		{[]string{"exec", "client"}, "want HOST and COMMAND"},
		{[]string{"exec", "client", "--"}, "want a COMMAND after --"},
		{[]string{"list", "extra"}, "unexpected argument"},
		{[]string{"profiles", "nosuch"}, "no profile"},
		{[]string{"profiles", "a", "b"}, "at most one"},
		{[]string{"ceiling", "--time", "10ms"}, "at least 1s"},
		{[]string{"bench"}, "at least one PROFILE"},
		{[]string{"bench", "--streams", "1,x", "lan"}, "--streams"},
		{[]string{"bench", "--streams", "0", "lan"}, "--streams"},
	} {
		code, out, errOut := runSync(tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "--help") || out != "" {
			t.Errorf("%q: exit %d, stderr %q, stdout %q; want exit 2 and %q", tc.args, code, errOut, out, tc.want)
		}
	}
	// A topology file with a mistake is a usage error naming it.
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("[[host]]\nname = \"a\"\nrtt = \"5ms\"\n"), 0o644)
	code, _, errOut := runSync("up", bad)
	if code != exitUsage || !strings.Contains(errOut, "bad.toml") || !strings.Contains(errOut, "rtt") {
		t.Errorf("up with a bad file: exit %d, %q", code, errOut)
	}
	// A host with no link is refused, naming it, before anything is made.
	unlinked := filepath.Join(t.TempDir(), "unlinked.toml")
	os.WriteFile(unlinked, []byte("[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[host]]\nname = \"c\"\n[[link]]\na = \"a\"\nb = \"b\"\n"), 0o644)
	code, out, errOut := runSync("up", unlinked)
	if code != exitUsage || !strings.Contains(errOut, `host "c" has no link`) || strings.Contains(errOut, "panic") || out != "" {
		t.Errorf("up with a host without link: exit %d (want %d), stdout %q, stderr %q", code, exitUsage, out, errOut)
	}
}

func TestProfiles(t *testing.T) {
	code, out, _ := runSync("profiles")
	if code != exitOK {
		t.Fatalf("profiles: exit %d", code)
	}
	for _, n := range lab.Profiles() {
		if !strings.Contains(out, n+" ") {
			t.Errorf("profiles does not list %s:\n%s", n, out)
		}
		code, file, _ := runSync("profiles", n)
		if code != exitOK {
			t.Fatalf("profiles %s: exit %d", n, code)
		}
		got, err := lab.ParseTopology([]byte(file))
		want, _ := lab.Profile(n)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("profiles %s printed\n%s\nwhich parses as %+v, %v", n, file, got, err)
		}
	}
}

// TestUsageFile keeps USAGE.txt equal to the commands' --help; run with
// -update to rewrite it.
func TestUsageFile(t *testing.T) { clitest.UsageFile(t, program) }

// buildBinary builds vlink-lab for the tests that run it as a program
// ("up --detach" starts its own executable again), under another name,
// as an installed copy may be: "down" must still stop its "up".
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vlink-lab-1")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func runBin(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if xe, ok := err.(*exec.ExitError); ok {
		return xe.ExitCode(), out.String(), errb.String()
	}
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return 0, out.String(), errb.String()
}

var labIDRE = regexp.MustCompile(`(?m)^lab (\d+-\d+): `)

// TestLifecycle drives the command as a person would: up --detach, list,
// exec (exit statuses pass through), down; then a holder that is
// SIGKILLed, whose lab "down" removes as stale.
func TestLifecycle(t *testing.T) {
	topo, err := lab.Profile("lan")
	if err != nil {
		t.Fatal(err)
	}
	lab.Require(t, topo.Programs()...)
	bin := buildBinary(t)
	code, out, errOut := runBin(t, bin, "up", "--detach", "lan")
	m := labIDRE.FindStringSubmatch(out)
	if code != exitOK || m == nil {
		t.Fatalf("up --detach: exit %d\n%s%s", code, out, errOut)
	}
	id := m[1]
	t.Cleanup(func() { runBin(t, bin, "down", id) })
	if !strings.Contains(out, "10.77.0.2") || !strings.Contains(out, "vlab-"+id+"-server") {
		t.Errorf("up does not show the hosts:\n%s", out)
	}
	code, out, _ = runBin(t, bin, "list")
	if code != exitOK || !regexp.MustCompile(id+`\s+running\s+lan`).MatchString(out) {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	code, out, _ = runBin(t, bin, "exec", "--lab", id, "client", "--", "cat", "/proc/sys/net/ipv4/tcp_congestion_control")
	if code != exitOK || strings.TrimSpace(out) != "cubic" {
		t.Errorf("exec cat: exit %d, %q", code, out)
	}
	if code, _, _ := runBin(t, bin, "exec", "--lab", id, "server", "sh", "-c", "exit 7"); code != 7 {
		t.Errorf("exec of a command exiting 7: exit %d", code)
	}
	if code, _, errOut := runBin(t, bin, "exec", "--lab", id, "nohost", "true"); code != exitUsage || !strings.Contains(errOut, "client, server") {
		t.Errorf("exec in an unknown host: exit %d, %q", code, errOut)
	}
	// The server reaches the client through the lab.
	if code, out, errOut := runBin(t, bin, "exec", "--lab", id, "server", "ip", "route", "get", "10.77.0.1"); code != exitOK || !strings.Contains(out, "dev to-client") {
		t.Errorf("ip route get in server: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runBin(t, bin, "down", id)
	if code != exitOK || !strings.Contains(out, "lab "+id+": down (stopped vlink-lab up") {
		t.Errorf("down: exit %d\n%s", code, out)
	}
	if _, out, _ := runBin(t, bin, "list"); strings.Contains(out, id) {
		t.Errorf("lab %s still listed after down:\n%s", id, out)
	}
	if code, _, errOut := runBin(t, bin, "down", id); code != exitFailure || !strings.Contains(errOut, "no lab "+id) {
		t.Errorf("down of a lab that is gone: exit %d, %q", code, errOut)
	}

	// A holder killed outright leaves a stale lab, which down removes.
	_, out, _ = runBin(t, bin, "up", "--detach", "wan50-clean")
	m = labIDRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("up --detach wan50-clean:\n%s", out)
	}
	id = m[1]
	var pid int
	for _, c := range id {
		if c == '-' {
			break
		}
		pid = pid*10 + int(c-'0')
	}
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, out, _ = runBin(t, bin, "list")
		if regexp.MustCompile(id + `\s+stale`).MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lab of the killed holder not listed as stale:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, out, _ = runBin(t, bin, "down")
	if code != exitOK || !strings.Contains(out, "lab "+id+": down (stale)") {
		t.Errorf("down: exit %d\n%s", code, out)
	}
	if ents, _ := os.ReadDir("/run/netns"); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "vlab-"+id) {
				t.Errorf("namespace %s left", e.Name())
			}
		}
	}
}

// TestDownLeavesOthersAlone: a lab of another live process (here, this
// test) is not taken down by a bare "down", only when named.
func TestDownLeavesOthersAlone(t *testing.T) {
	l := lab.New(t, lab.Topology{Hosts: []lab.Host{{Name: "a"}}})
	code, out, _ := runSync("down")
	if code != exitOK || !strings.Contains(out, "lab "+l.ID()+": left alone") {
		t.Fatalf("down: exit %d\n%s", code, out)
	}
	if err := l.Do("a", func() error { return nil }); err != nil {
		t.Fatalf("the lab after down: %v", err)
	}
	code, out, _ = runSync("down", l.ID())
	if code != exitOK || !strings.Contains(out, "removed under its owner") {
		t.Fatalf("down %s: exit %d\n%s", l.ID(), code, out)
	}
}

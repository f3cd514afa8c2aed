//go:build linux

package realserver

import (
	"net"
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestStopKillsWhatLeftTheGroup: a child that left the leader's process
// group (setsid, as a daemon's per-connection processes do) and ignores
// SIGTERM is gone once Stop returns, not left running past the test.
func TestStopKillsWhatLeftTheGroup(t *testing.T) {
	testenv.Programs(t, "setsid")
	// The child lets go of the output, as a daemon's processes do, so the
	// leader's end is Stop's signal to finish.
	p := Start(t, "sh", "-c", `setsid sh -c 'trap "" TERM; echo child $$; exec >/dev/null 2>&1; while :; do sleep 1; done' & wait`)
	m := p.WaitFor(t, regexp.MustCompile(`child (\d+)`), 10*time.Second)
	child, _ := strconv.Atoi(m[1])
	if startTime(child) == "" {
		t.Fatalf("no process %d", child)
	}
	p.Stop(t)
	deadline := time.Now().Add(5 * time.Second)
	for startTime(child) != "" && !zombie(child) {
		if time.Now().After(deadline) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("process %d, which left the group and ignores SIGTERM, outlived Stop", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func zombie(pid int) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return regexp.MustCompile(`\) Z `).Match(b)
}

// Stop reports a port still listening only when the stopped tree holds it:
// a parallel test may be handed the port the moment it is free, as CI saw.
func TestStopPortReused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	p := Start(t, "sh", "-c", "echo up; exec sleep 30")
	p.WaitFor(t, regexp.MustCompile(`up`), 10*time.Second)
	// The port the process "listened on" is held by this test process,
	// as another test's listener would hold it.
	p.Ports = append(p.Ports, port)
	p.Stop(t)
	if pid := holder(port, []int{os.Getpid()}, map[int]string{os.Getpid(): startTime(os.Getpid())}); pid != os.Getpid() {
		t.Errorf("holder says pid %d holds this process's listener on port %d, want %d", pid, port, os.Getpid())
	}
}

// TestStopKillsWhatTheTreeMakesMeanwhile: a leader that starts a new
// child (setsid, as a daemon's session for a client that reconnected)
// once Stop's signals ended the old one, before it ends itself, does not
// leave that child running: Stop listed the tree before it was made.
func TestStopKillsWhatTheTreeMakesMeanwhile(t *testing.T) {
	testenv.Programs(t, "setsid")
	// The leader takes SIGTERM and goes on, as a daemon busy with a
	// client may; each child keeps the output, as sshd's sessions do.
	p := Start(t, "sh", "-c", `trap "busy=1" TERM; while :; do setsid sh -c 'echo child $$; exec sleep 1000' & wait $!; done`)
	p.WaitFor(t, regexp.MustCompile(`child \d+`), 10*time.Second)
	start := time.Now()
	p.Stop(t)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Stop took %v: it waited for a child holding the output", d)
	}
	children := regexp.MustCompile(`child (\d+)`).FindAllStringSubmatch(p.Output(), -1)
	if len(children) < 2 {
		t.Fatalf("the leader made no child after Stop's signals: %q", p.Output())
	}
	for _, m := range children {
		pid, _ := strconv.Atoi(m[1])
		deadline := time.Now().Add(5 * time.Second)
		for startTime(pid) != "" && !zombie(pid) {
			if time.Now().After(deadline) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("child %d outlived Stop", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

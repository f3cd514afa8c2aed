//go:build linux

package realserver

import (
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

//go:build linux

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// buildWorker builds testdata/launchworker, a worker that joins its job
// and exchanges bytes with every other rank.
func buildWorker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "launchworker")
	build := exec.Command("go", "build", "-o", bin, "./integration/testdata/launchworker")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// leftovers counts the processes whose command line holds marker.
func leftovers(t *testing.T, marker string) int {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", marker).Output()
	return len(strings.Fields(string(out)))
}

// waitGone waits until no process's command line holds marker.
func waitGone(t *testing.T, marker string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); leftovers(t, marker) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes of the job are left behind (%q)", leftovers(t, marker), marker)
		}
	}
}

// TestLaunchAllToAll starts 8 workers that find each other by rank
// through the job's network and exchange bytes all to all, each checked
// by SHA-256 by its receiver.
func TestLaunchAllToAll(t *testing.T) {
	worker := buildWorker(t)
	out, stderr, err := run(2*time.Minute, nil, vlinkBin, "launch", "-n", "8", "--", worker)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	for r := range 8 {
		if line := fmt.Sprintf("[%d] rank %d: all 7 peers ok\n", r, r); !strings.Contains(string(out), line) {
			t.Errorf("no %q in the output:\n%s", line, out)
		}
	}
}

// TestLaunchExit: the job's status is its first failure's, named; the
// other workers, and what they started, are stopped.
func TestLaunchExit(t *testing.T) {
	testenv.Programs(t, "pgrep")
	marker := fmt.Sprintf("303.%d", time.Now().UnixNano()%1e6)
	for _, tc := range []struct {
		name, script string
		args         []string
		code         int
		stderr       string
	}{
		{"success", `echo "rank $VLINK_RANK of $VLINK_SIZE is $VLINK_NODE"`, nil, 0, ""},
		{"a worker fails", `if [ "$VLINK_RANK" = 1 ]; then exit 7; fi; sleep ` + marker + ` & wait`, nil, 7,
			"vlink launch: rank 1 exited with status 7\n"},
		{"a worker is killed", `if [ "$VLINK_RANK" = 2 ]; then kill -SEGV $$; fi; sleep ` + marker + ` & wait`, nil, 128 + 11,
			"vlink launch: rank 2 was killed by signal segmentation fault\n"},
		{"workers that never join", `if [ "$VLINK_RANK" = 0 ]; then exit 0; fi; sleep ` + marker + ` & wait`, []string{"--join-timeout", "1s"}, 1,
			"vlink launch: rank 1, rank 2 did not join the job's network within 1s"},
		{"no program", "", []string{}, 2, "give the program to start after --"},
		{"no workers", "true", []string{"-n", "0"}, 2, "-n 0: want 1 to 4096 workers"},
		{"too many workers", "true", []string{"-n", "5000"}, 2, "-n 5000: want 1 to 4096 workers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"launch", "-n", "3", "--grace", "1s"}, tc.args...)
			if tc.script != "" {
				args = append(args, "--", "sh", "-c", tc.script)
			}
			out, stderr, err := run(time.Minute, nil, vlinkBin, args...)
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Fatalf("exit status %d, want %d; stderr:\n%s\nwant %q in it; stdout:\n%s", code, tc.code, stderr, tc.stderr, out)
			}
			if tc.name == "success" {
				for r := range 3 {
					if line := fmt.Sprintf("[%d] rank %d of 3 is rank%d\n", r, r, r); !strings.Contains(string(out), line) {
						t.Errorf("no %q in the output:\n%s", line, out)
					}
				}
			}
			waitGone(t, "sleep "+marker)
		})
	}
}

// TestLaunchSignals: SIGTERM to vlink launch reaches every worker, whose
// status then ends the job; vlink launch killed with SIGKILL leaves no
// worker, nor what the workers started, behind.
func TestLaunchSignals(t *testing.T) {
	testenv.Programs(t, "pgrep")
	marker := fmt.Sprintf("304.%d", time.Now().UnixNano()%1e6)
	t.Run("SIGTERM", func(t *testing.T) {
		p := startProc(t, vlinkBin, "launch", "-n", "3", "--join-timeout", "0", "--", "sh", "-c",
			`trap 'echo got TERM; exit 3' TERM; echo started; sleep `+marker+` & wait`)
		p.Strict = false
		waitCount(t, p, regexp.MustCompile(`\] started`), 3, startTimeout)
		p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs after SIGTERM:\n%s", p.Output())
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 3 {
			t.Errorf("exit: %v, want status 3 (the workers')", p.Err())
		}
		if n := strings.Count(p.Output(), "] got TERM"); n != 3 || !strings.Contains(p.Output(), "exited with status 3, stopped by vlink launch") {
			t.Errorf("%d workers got SIGTERM, want 3; output:\n%s", n, p.Output())
		}
		waitGone(t, "sleep "+marker)
	})
	t.Run("SIGKILL", func(t *testing.T) {
		p := startProc(t, vlinkBin, "launch", "-n", "3", "--join-timeout", "0", "--", "sh", "-c", `echo started "$VLINK_NODE_KEY_FILE"; sleep `+marker+` & wait`)
		keyFile := startedKeyFile(t, p)
		if _, err := os.Stat(keyFile); err != nil {
			t.Fatalf("the worker's key file: %v", err)
		}
		if n := leftovers(t, "sleep "+marker); n < 3 {
			t.Fatalf("%d of the workers' sleeps found, want 3 or more", n)
		}
		p.Kill()
		waitGone(t, "sleep "+marker)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(filepath.Dir(keyFile)); errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the job's key files outlive vlink launch: %s", filepath.Dir(keyFile))
			}
		}
	})
}

// startedKeyFile waits until the three workers of p said they started, and
// returns the key file the last one named.
func startedKeyFile(t *testing.T, p *proc) string {
	t.Helper()
	re := regexp.MustCompile(`\] started (\S+)`)
	waitCount(t, p, re, 3, startTimeout)
	m := re.FindAllStringSubmatch(p.Output(), -1)
	return m[len(m)-1][1]
}

//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// buildWorker builds testdata/launchworker, a worker that joins its job
// and exchanges bytes with every other rank.
func buildWorker(t testing.TB) string {
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

// waitLeftovers waits until at least n processes' command lines hold
// marker, and returns how many do. A worker that printed it started has
// not necessarily exec'd the command it starts after that line (the
// shell forks it in the background): counting once right after the
// lines came found 3 of 4 in CI.
func waitLeftovers(t *testing.T, marker string, n int) int {
	t.Helper()
	got := leftovers(t, marker)
	for deadline := time.Now().Add(10 * time.Second); got < n && time.Now().Before(deadline); got = leftovers(t, marker) {
		time.Sleep(50 * time.Millisecond)
	}
	return got
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

// TestLaunchAllToAll starts 8 workers that find each other by rank and
// exchange bytes all to all, each checked by SHA-256 by its receiver:
// over shared memory, all being on this machine, or with --shm=false
// through the job's network.
func TestLaunchAllToAll(t *testing.T) {
	worker := buildWorker(t)
	for _, tc := range []struct {
		flag, paths string
	}{
		{"--shm=true", "shm 7, network 0"},
		{"--shm=false", "shm 0, network 7"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			out, stderr, err := run(2*time.Minute, nil, vlinkBin, "launch", "-n", "8", tc.flag, "--", worker)
			if err != nil {
				t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
			}
			for r := range 8 {
				for _, line := range []string{fmt.Sprintf("[%d] rank %d: all 7 peers ok\n", r, r), fmt.Sprintf("[%d] rank %d: dialed 7 peers: %s\n", r, r, tc.paths)} {
					if !strings.Contains(string(out), line) {
						t.Errorf("no %q in the output:\n%s", line, out)
					}
				}
			}
		})
	}
}

// TestLaunchCleansShm: a worker that exits without leaving its job
// (launch.Job.Close), as one killed does, leaves no shared-memory
// socket behind: vlink launch removes it once the worker ended.
func TestLaunchCleansShm(t *testing.T) {
	worker := buildWorker(t)
	out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "3", "--", worker, "leave")
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	m := regexp.MustCompile(`rank 0 of job ([0-9a-f]{32}) leaves`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no job id in the output:\n%s", out)
	}
	// The shm factory's folder: vlink-shm-UID in the temporary folder.
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "vlink-shm-*", "job-"+string(m[1])+"-*"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
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

// TestLaunchSignals: SIGTERM to vlink launch reaches every worker as
// SIGTERM, SIGINT as SIGINT, and the workers' status then ends the job;
// a second SIGINT kills them at once; vlink launch killed with SIGKILL
// leaves no worker, nor what the workers started, behind.
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
	t.Run("SIGINT", func(t *testing.T) {
		// A program's Ctrl-C handler is for SIGINT: the workers get it,
		// not SIGTERM.
		p := startProc(t, vlinkBin, "launch", "-n", "3", "--join-timeout", "0", "--", "sh", "-c",
			`trap 'echo got INT; exit 4' INT; trap 'echo got TERM; exit 3' TERM; echo started; sleep `+marker+` & wait`)
		p.Strict = false
		waitCount(t, p, regexp.MustCompile(`\] started`), 3, startTimeout)
		p.Cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs after SIGINT:\n%s", p.Output())
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 4 {
			t.Errorf("exit: %v, want status 4 (the workers' on SIGINT)", p.Err())
		}
		if n := strings.Count(p.Output(), "] got INT"); n != 3 || strings.Contains(p.Output(), "got TERM") {
			t.Errorf("%d workers got SIGINT, want 3, and none SIGTERM; output:\n%s", n, p.Output())
		}
		waitGone(t, "sleep "+marker)
	})
	t.Run("second SIGINT", func(t *testing.T) {
		// Workers that ignore SIGINT and SIGTERM, and a process each
		// that left their group and ignores SIGTERM: the first Ctrl-C
		// leaves them the 60 s grace, the second kills them all at once.
		p := startProc(t, vlinkBin, "launch", "-n", "2", "--join-timeout", "0", "--grace", "60s", "--", "sh", "-c",
			`trap '' INT TERM; setsid sh -c "trap '' TERM; sleep `+marker+`" & echo started; while :; do sleep `+marker+`; done`)
		p.Strict = false
		waitCount(t, p, regexp.MustCompile(`\] started`), 2, startTimeout)
		p.Cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.Done():
			t.Fatalf("vlink launch ended at the first SIGINT, with workers that ignore it:\n%s", p.Output())
		case <-time.After(300 * time.Millisecond):
		}
		start := time.Now()
		p.Cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs %v after a second SIGINT:\n%s", startTimeout, p.Output())
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 128+int(syscall.SIGKILL) {
			t.Errorf("exit: %v after %v, want status 137 (the workers were killed)", p.Err(), time.Since(start))
		}
		waitGone(t, "sleep "+marker) // the setsid one too, well within the grace
	})
	t.Run("SIGKILL", func(t *testing.T) {
		p := startProc(t, vlinkBin, "launch", "-n", "3", "--join-timeout", "0", "--", "sh", "-c", `echo started "$VLINK_NODE_KEY_FILE"; sleep `+marker+` & wait`)
		keyFile := startedKeyFile(t, p)
		if _, err := os.Stat(keyFile); err != nil {
			t.Fatalf("the worker's key file: %v", err)
		}
		if n := waitLeftovers(t, "sleep "+marker, 3); n < 3 {
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

// TestLaunchNothingEscapes: a worker's process that leaves its process
// group (setsid) or forks twice still ends with the job: when the job
// ends, and when vlink launch is killed (its guard ends the job's
// cgroup; with the subreaper only the first holds, and the log says so).
func TestLaunchNothingEscapes(t *testing.T) {
	testenv.Programs(t, "pgrep", "setsid")
	marker := fmt.Sprintf("305.%d", time.Now().UnixNano()%1e6)
	escape := `setsid sleep ` + marker + ` & (sleep ` + marker + `1 &) ; `
	t.Run("job ends", func(t *testing.T) {
		out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "2", "--log-level", "info", "--", "sh", "-c", escape+`sleep 0.3`)
		if err != nil {
			t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
		}
		if !strings.Contains(string(stderr), "the job's processes are held") {
			t.Errorf("the log does not say how the job's processes are held:\n%s", stderr)
		}
		waitGone(t, "sleep "+marker)
	})
	t.Run("SIGKILL", func(t *testing.T) {
		p := startProc(t, vlinkBin, "launch", "-n", "2", "--join-timeout", "0", "--log-level", "info", "--", "sh", "-c", escape+`echo started; wait`)
		p.Strict = false
		waitCount(t, p, regexp.MustCompile(`\] started`), 2, startTimeout)
		if !strings.Contains(p.Output(), "held in a cgroup of its own") {
			p.Kill()
			testenv.Missing(t, "a cgroup for the job (the subreaper does not outlive vlink launch); vlink launch said:\n%s", p.Output())
		}
		if n := waitLeftovers(t, "sleep "+marker, 4); n < 4 {
			t.Fatalf("%d of the escaped sleeps found, want 4", n)
		}
		p.Kill()
		waitGone(t, "sleep "+marker)
	})
}

// TestLaunchTimeLimit: --time ends a job that runs past it, with
// status 124 and a message naming the limit, and nothing left behind;
// a job within its time is not touched.
func TestLaunchTimeLimit(t *testing.T) {
	testenv.Programs(t, "pgrep")
	marker := fmt.Sprintf("307.%d", time.Now().UnixNano()%1e6)
	start := time.Now()
	_, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "2", "--time", "1s", "--join-timeout", "0", "--", "sh", "-c", "sleep "+marker)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 124 || !strings.Contains(string(stderr), "ran out of its time (--time 1s)") {
		t.Fatalf("vlink launch: %v after %v, want status 124 naming --time 1s; stderr:\n%s", err, time.Since(start), stderr)
	}
	if !strings.Contains(string(stderr), "vlink launch: every rank: ranks 0-1: killed by signal terminated\n") {
		t.Errorf("no summary of how each rank ended; stderr:\n%s", stderr)
	}
	waitGone(t, "sleep "+marker)
	if out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "2", "--time", "30s", "--", "true"); err != nil {
		t.Fatalf("a job within its --time: %v\n%s%s", err, out, stderr)
	}
}

// TestLaunchStdinBackground: vlink launch run in the background of an
// interactive shell's terminal (vlink launch ... &) does not read the
// terminal, which would stop the whole job (SIGTTIN): rank 0's input
// ends at once and the job completes. script(1) gives the shell its
// terminal.
func TestLaunchStdinBackground(t *testing.T) {
	testenv.Programs(t, "script", "bash")
	inner := vlinkBin + ` launch -n 1 -- sh -c 'echo "got $(wc -c) bytes"' & sleep 10 & wait %1; echo "job done $?"; kill -9 %1 %2 2>/dev/null`
	out, stderr, err := run(time.Minute, nil, "script", "-qec", "bash --norc -ic "+shellQuote(inner), "/dev/null")
	if err != nil || !strings.Contains(string(out), "[0] got 0 bytes") || !strings.Contains(string(out), "job done 0") {
		t.Fatalf("script: %v; want rank 0 to read nothing and the job to end at once; output:\n%s%s", err, out, stderr)
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestLaunchTags: --tag-host names the host in each line's tag, and
// --timestamps puts the time the line came after it.
func TestLaunchTags(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "2", "--tag-host", "--timestamps", "--", "sh", "-c", `echo "hi $VLINK_RANK"; echo "err $VLINK_RANK" >&2`)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	for r := range 2 {
		for _, tc := range []struct{ where, what string }{{string(out), "hi"}, {stderr, "err"}} {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[%d@%s\] \d\d:\d\d:\d\d\.\d{3} %s %d$`, r, regexp.QuoteMeta(host), tc.what, r))
			if !re.MatchString(tc.where) {
				t.Errorf("no line matching %s in:\n%s", re, tc.where)
			}
		}
	}
}

// TestLaunchOutputDir: --output-dir puts each rank's output and error in
// files of their own, not in vlink launch's.
func TestLaunchOutputDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "3", "--output-dir", dir, "--", "sh", "-c", `echo "out $VLINK_RANK"; echo "err $VLINK_RANK" >&2`)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	if strings.Contains(string(out)+string(stderr), "out ") {
		t.Errorf("the workers' output reached vlink launch's:\n%s%s", out, stderr)
	}
	for r := range 3 {
		for ext, want := range map[string]string{".out": fmt.Sprintf("out %d\n", r), ".err": fmt.Sprintf("err %d\n", r)} {
			got, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank%d%s", r, ext)))
			if err != nil || string(got) != want {
				t.Errorf("rank%d%s holds %q (%v), want %q", r, ext, got, err, want)
			}
		}
	}
}

// TestLaunchStdin: vlink launch's standard input reaches rank 0 by
// default (as mpirun), the rank --stdin names, every rank with all, or
// none; through a pipe (copied) and from a file (which a single rank
// reads itself), with the local spawner and the custom one (whose
// workers' agents get it in frames). Each worker prints the SHA-256 of
// what it read.
func TestLaunchStdin(t *testing.T) {
	input := testnet.RandomBytes(300<<10+7, 9) // more than one frame
	sum := fmt.Sprintf("%x", sha256.Sum256(input))
	empty := fmt.Sprintf("%x", sha256.Sum256(nil))
	file := filepath.Join(t.TempDir(), "input")
	if err := os.WriteFile(file, input, 0o644); err != nil {
		t.Fatal(err)
	}
	custom := []string{"--custom", "for i in $(seq %N); do %C & done; wait", "--route-output"}
	for _, tc := range []struct {
		name     string
		args     []string
		fromFile bool
		takers   []int
	}{
		{"rank 0 by default", nil, false, []int{0}},
		{"rank 0 from a file", nil, true, []int{0}},
		{"rank 2", []string{"--stdin", "2"}, true, []int{2}},
		{"all", []string{"--stdin", "all"}, false, []int{0, 1, 2}},
		{"none", []string{"--stdin", "none"}, false, nil},
		{"custom, rank 1", append([]string{"--stdin", "1"}, custom...), false, []int{1}},
		{"custom, all", append([]string{"--stdin", "all"}, custom...), true, []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in io.Reader = bytes.NewReader(input)
			if tc.fromFile {
				f, err := os.Open(file)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				in = f
			}
			args := append(append([]string{"launch", "-n", "3"}, tc.args...), "--", "sh", "-c", `echo "rank $VLINK_RANK read $(sha256sum | cut -d' ' -f1)"`)
			out, stderr, err := run(time.Minute, in, vlinkBin, args...)
			if err != nil {
				t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
			}
			for r := range 3 {
				want := empty
				if slices.Contains(tc.takers, r) {
					want = sum
				}
				if line := fmt.Sprintf("[%d] rank %d read %s\n", r, r, want); !strings.Contains(string(out), line) {
					t.Errorf("no %q in the output:\n%s", line, out)
				}
			}
		})
	}
}

// TestLaunchMPI: Open MPI's mpirun as the custom spawner's command, the
// job's secret exported to its processes with -x as the guide shows:
// each agent's rank is its MPI rank (OMPI_COMM_WORLD_RANK), and the
// workers exchange bytes all to all.
func TestLaunchMPI(t *testing.T) {
	testenv.Programs(t, "mpirun", "ssh") // Open MPI wants its rsh agent even on one machine
	worker := buildWorker(t)
	t.Setenv("OMPI_ALLOW_RUN_AS_ROOT", "1") // the tests run as root in CI
	t.Setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
	custom := "mpirun --oversubscribe -x VLINK_LAUNCH_SECRET -np %N %C"
	out, stderr, err := run(2*time.Minute, nil, vlinkBin, "launch", "-n", "4", "--route-output", "--custom", custom, "--",
		"sh", "-c", `echo "rank $VLINK_RANK is MPI rank $OMPI_COMM_WORLD_RANK"; exec `+worker)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	for r := range 4 {
		for _, line := range []string{fmt.Sprintf("[%d] rank %d is MPI rank %d\n", r, r, r), fmt.Sprintf("[%d] rank %d: all 3 peers ok\n", r, r)} {
			if !strings.Contains(string(out), line) {
				t.Errorf("no %q in the output:\n%s", line, out)
			}
		}
	}
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

// spawnScript is the custom spawner's script of the tests: it records
// the substitutions it was given and starts N copies of the command
// after its "--".
const spawnScript = `n=$1 dir=$2 prog=$3 servers=$4 pct=$5
shift 6
printf 'N=%s D=%s P=%s M=%s pct=%s\n' "$n" "$dir" "$prog" "$servers" "$pct" > "$SPAWN_RECORD"
i=0
while [ $i -lt "$n" ]; do "$@" & i=$((i+1)); done
wait
`

// TestLaunchCustom: the custom spawner runs its command once with every
// substitution of udp-conduit's spawner, and the 8 workers it starts
// connect back, get their ranks and exchange bytes all to all, checked
// by SHA-256; the seed's variable names work as aliases.
func TestLaunchCustom(t *testing.T) {
	worker := buildWorker(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "spawn.sh")
	if err := os.WriteFile(script, []byte(spawnScript), 0o755); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(dir, "record")
	t.Setenv("SPAWN_RECORD", record)
	t.Setenv("CSPAWN_SERVERS", "n0 n1 n2 n3 n4 n5 n6 n7 n8 n9")
	t.Setenv("GASNET_CSPAWN_ROUTE_OUTPUT", "1")
	t.Setenv("GASNET_SPAWNFN", "C")
	t.Setenv("GASNET_CSPAWN_CMD", "sh "+script+" %N %D %P '%M' %% -- %C")
	out, stderr, err := run(2*time.Minute, nil, vlinkBin, "launch", "-n", "8", "--", worker)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	for r := range 8 {
		// The agents pass the job's id on: ranks of this machine find
		// each other over shared memory.
		for _, line := range []string{fmt.Sprintf("[%d] rank %d: all 7 peers ok\n", r, r), fmt.Sprintf("[%d] rank %d: dialed 7 peers: shm 7, network 0\n", r, r)} {
			if !strings.Contains(string(out), line) {
				t.Errorf("no %q in the output:\n%s", line, out)
			}
		}
	}
	got, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	cwd, _ := os.Getwd()
	if want := fmt.Sprintf("N=8 D=%s P=%s M=n0 n1 n2 n3 n4 n5 n6 n7 pct=%%\n", cwd, worker); string(got) != want {
		t.Errorf("the custom command was given\n%s\nwant\n%s", got, want)
	}
}

// TestLaunchCustomBad: what goes wrong with a custom command is said,
// and never runs a worker without its rank; an agent without the job's
// secret gets no rank.
func TestLaunchCustomBad(t *testing.T) {
	testenv.Programs(t, "pgrep")
	marker := fmt.Sprintf("305.%d", time.Now().UnixNano()%1e6)
	badSecret := strings.Repeat("00", 32)
	for _, tc := range []struct {
		name, template, script string
		code                   int
		stderr, stdout         []string
		agents                 string // in the agents' errors
	}{
		{name: "no %C", template: "srun -n %N ./a.out", script: "true", code: 2,
			stderr: []string{`it never runs %C, the command each worker must run`}},
		{name: "an unknown escape", template: "srun -n %N %X %C", script: "true", code: 2,
			stderr: []string{`%X: the escapes are %N %C %D %M %P and %%`}},
		{name: "the command fails", template: "echo cannot start; exit 5; %C", script: "true", code: 5,
			stderr: []string{"vlink launch: the custom command exited with status 5 having started 0 of 3 workers"}},
		{name: "fewer workers than N", template: "%C & %C & wait", script: "echo up; sleep " + marker, code: 1,
			stderr: []string{"vlink launch: rank 0, rank 1 did not join the job's network within 2s", "; rank 2 never started within 2s (the spawner started 2 of 3 workers)"}},
		// The agents' own errors go to $AGENTS, which the ranked workers
		// wait on, so the refusal comes while the job still runs.
		{name: "more workers than N", template: "%C 2>>$AGENTS & %C 2>>$AGENTS & %C 2>>$AGENTS & %C 2>>$AGENTS & wait",
			script: `echo rank $VLINK_RANK; until grep -q "no rank" "$AGENTS"; do sleep 0.05; done`, code: 0,
			agents: "vlink launch gave this worker no rank: the job has all its workers",
			stdout: []string{"rank 0\n", "rank 1\n", "rank 2\n"}},
		{name: "an agent without the secret", template: "VLINK_LAUNCH_SECRET=" + badSecret + " %C 2>>$AGENTS & %C 2>>$AGENTS & %C 2>>$AGENTS & %C 2>>$AGENTS & wait",
			script: `echo rank $VLINK_RANK; until grep -q "authentication failed" "$AGENTS"; do sleep 0.05; done`, code: 0,
			agents: "refused by peer: authentication failed: the proof does not match this listener's key",
			stdout: []string{"rank 0\n", "rank 1\n", "rank 2\n"}},
		{name: "a worker fails", template: "%C & %C & %C & wait", script: `if [ "$VLINK_RANK" = 1 ]; then exit 9; fi; sleep ` + marker, code: 9,
			stderr: []string{"vlink launch: rank 1 exited with status 9 on "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agents := filepath.Join(t.TempDir(), "agents")
			t.Setenv("AGENTS", agents)
			joinTimeout := "2s"
			if tc.agents != "" {
				joinTimeout = "0" // the workers wait for the agents' errors
			}
			out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "-n", "3", "--grace", "1s", "--join-timeout", joinTimeout,
				"--custom", tc.template, "--", "sh", "-c", tc.script)
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Fatalf("exit status %d, want %d; stderr:\n%s\nstdout:\n%s", code, tc.code, stderr, out)
			}
			for _, s := range tc.stderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("no %q in stderr:\n%s", s, stderr)
				}
			}
			for _, s := range tc.stdout {
				if strings.Count(string(out), s) != 1 {
					t.Errorf("want %q once in stdout:\n%s", s, out)
				}
			}
			if tc.agents != "" {
				if b, _ := os.ReadFile(agents); strings.Count(string(b), tc.agents) != 1 {
					t.Errorf("want %q once in the agents' errors:\n%s", tc.agents, b)
				}
			}
			waitGone(t, "sleep "+marker)
		})
	}
}

// TestLaunchSSHNoForwarding: a server whose sshd refuses TCP forwarding
// still runs its workers when --relay-listen says where they reach the
// job's relay themselves.
func TestLaunchSSHNoForwarding(t *testing.T) {
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: false})
	opts := fmt.Sprintf("port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none",
		s.Port, s.User, s.UserKey.Private, s.KnownHosts)
	worker := buildWorker(t)
	out, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "--n", "2", "--relay-listen", "127.0.0.1:0", "--log-level", "info",
		"--ssh-servers", s.Host, "--ssh-options", opts, "--", worker)
	if err != nil {
		t.Fatalf("vlink launch: %v\n%s%s", err, out, stderr)
	}
	for r := range 2 {
		if line := fmt.Sprintf("[%d] rank %d: all 1 peers ok\n", r, r); !strings.Contains(string(out), line) {
			t.Errorf("no %q in the output:\n%s", line, out)
		}
	}
	if !strings.Contains(stderr, "refuses TCP forwarding: its workers reach the job's relay themselves") {
		t.Errorf("the log does not say the workers reach the relay themselves:\n%s", stderr)
	}
}

// TestLaunchSSHErrors checks that the ssh spawner blames what failed: a
// host key it cannot check is no TCP forwarding refused, and a refused
// forwarding says what the server must allow.
func TestLaunchSSHErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		forwarding bool
		knownHosts func(s *realserver.SSHD) string
		want       []string
		not        string
	}{
		{"unknown host key", true, func(*realserver.SSHD) string { return filepath.Join(t.TempDir(), "known_hosts") },
			[]string{"reaching 127.0.0.1 over SSH", "host key unknown", "ssh-keyscan -p "}, "TCP forwarding"},
		{"forwarding refused", false, func(s *realserver.SSHD) string { return s.KnownHosts },
			[]string{"its sshd must allow TCP forwarding, or give --relay-listen", "refused to listen"}, "host key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: tc.forwarding})
			opts := fmt.Sprintf("port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none",
				s.Port, s.User, s.UserKey.Private, tc.knownHosts(s))
			_, stderr, err := run(time.Minute, nil, vlinkBin, "launch", "--n", "1", "--ssh-servers", s.Host, "--ssh-options", opts, "--", "true")
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("vlink launch: %v, want exit status 1", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			if strings.Contains(stderr, tc.not) {
				t.Errorf("stderr speaks of %q:\n%s", tc.not, stderr)
			}
		})
	}
}

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// startSlurm runs a one-node Slurm cluster for the test, as root: munged
// with a key of its own, slurmctld and slurmd, all in the foreground, on
// free ports, configured by a slurm.conf that SLURM_CONF names for the
// test and what it starts. The node claims 8 CPUs (config_overrides), so
// that jobs of up to 8 tasks run on a 2-core machine.
func startSlurm(t testing.TB) {
	t.Helper()
	testenv.Root(t, "to run slurmctld, slurmd and munged")
	testenv.Programs(t, "munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo")
	dir := t.TempDir()
	for _, d := range []string{"state", "spool"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(i*7 + 3)
	}
	if err := os.WriteFile(filepath.Join(dir, "munge.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	ports := []int{realserver.FreePort(t), realserver.FreePort(t)}
	for ports[1] == ports[0] {
		ports[1] = realserver.FreePort(t)
	}
	conf := fmt.Sprintf(`ClusterName=vlinktest
SlurmctldHost=%[1]s(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=%[2]s/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%[2]s/state
SlurmdSpoolDir=%[2]s/spool
SlurmctldPidFile=%[2]s/slurmctld.pid
SlurmdPidFile=%[2]s/slurmd.pid
SlurmctldPort=%[3]d
SlurmdPort=%[4]d
SlurmctldLogFile=%[2]s/slurmctld.log
SlurmdLogFile=%[2]s/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
KillWait=5
NodeName=%[1]s NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=%[1]s Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
`, host, dir, ports[0], ports[1])
	confFile := filepath.Join(dir, "slurm.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLURM_CONF", confFile)
	realserver.Start(t, "munged", "-F", "--force", "--socket="+dir+"/munge.sock", "--key-file="+dir+"/munge.key",
		"--pid-file="+dir+"/munged.pid", "--log-file="+dir+"/munged.log", "--seed-file="+dir+"/munge.seed")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(dir + "/munge.sock"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("munged did not make its socket")
		}
	}
	realserver.Start(t, "slurmctld", "-D")
	realserver.Start(t, "slurmd", "-D")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _ := exec.Command("sinfo", "-h", "-o", "%T").Output()
		if strings.TrimSpace(string(out)) == "idle" {
			return
		}
		if time.Now().After(deadline) {
			ctl, _ := os.ReadFile(dir + "/slurmctld.log")
			d, _ := os.ReadFile(dir + "/slurmd.log")
			t.Fatalf("the Slurm node is not idle after 30 s (sinfo: %q)\nslurmctld.log:\n%s\nslurmd.log:\n%s", out,
				realserver.Tail(string(ctl), 2000), realserver.Tail(string(d), 2000))
		}
	}
}

// sbatch submits command as a batch job of n tasks (sbatch --wrap, as
// the README shows) and waits for it: it returns the job's output and
// sbatch's error (its status is the job's).
func sbatch(t *testing.T, n int, command string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "job.out")
	b, err := exec.Command("sbatch", "--wait", "--quiet", "-n", fmt.Sprint(n), "-o", out, "--chdir", dir, "--wrap", command).CombinedOutput()
	got, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatalf("sbatch: %v\n%s(no output file: %v)", err, b, rerr)
	}
	return string(got), err
}

// TestLaunchSlurm runs vlink launch as a Slurm batch job on a real
// slurmctld and slurmd: it finds the allocation, starts the workers as
// one srun step, gives rank R to Slurm's task R, the workers exchange
// bytes all to all (checked by SHA-256), and a failing rank's status is
// the job's, which sbatch --wait returns.
func TestLaunchSlurm(t *testing.T) {
	startSlurm(t)
	worker := buildWorker(t)
	t.Run("ranks are Slurm's tasks", func(t *testing.T) {
		out, err := sbatch(t, 4, vlinkBin+` launch -- sh -c 'echo "rank $VLINK_RANK task $SLURM_PROCID of $VLINK_SIZE"'`)
		if err != nil {
			t.Fatalf("the job: %v\n%s", err, out)
		}
		for r := range 4 {
			if line := fmt.Sprintf("[%d] rank %d task %d of 4\n", r, r, r); !strings.Contains(out, line) {
				t.Errorf("no %q in the job's output:\n%s", line, out)
			}
		}
	})
	t.Run("all to all", func(t *testing.T) {
		out, err := sbatch(t, 4, vlinkBin+" launch -- "+worker)
		if err != nil {
			t.Fatalf("the job: %v\n%s", err, out)
		}
		for r := range 4 {
			// One node: the ranks talk over shared memory.
			for _, line := range []string{fmt.Sprintf("[%d] rank %d: all 3 peers ok\n", r, r), fmt.Sprintf("[%d] rank %d: dialed 3 peers: shm 3, network 0\n", r, r)} {
				if !strings.Contains(out, line) {
					t.Errorf("no %q in the job's output:\n%s", line, out)
				}
			}
		}
	})
	t.Run("a rank fails", func(t *testing.T) {
		out, err := sbatch(t, 3, vlinkBin+` launch --join-timeout 0 -- sh -c 'test "$VLINK_RANK" != 2 || exit 5; sleep 30'`)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 5 {
			t.Errorf("sbatch --wait: %v, want status 5 (rank 2's)\n%s", err, out)
		}
		if !strings.Contains(out, "vlink launch: rank 2 exited with status 5") {
			t.Errorf("the job's output does not name the failed rank:\n%s", out)
		}
	})
	t.Run("scancel", func(t *testing.T) {
		// Slurm ends a job (scancel, or its time limit) with SIGTERM to
		// its steps: each worker gets it, through its agent, as it would
		// under srun alone.
		dir := t.TempDir()
		file, outFile := filepath.Join(dir, "job.sh"), filepath.Join(dir, "job.out")
		script := "#!/bin/sh\n" + vlinkBin + ` launch --join-timeout 0 -- sh -c 'trap "echo got TERM; exit 3" TERM; echo started; sleep 60 & wait'` + "\n"
		if err := os.WriteFile(file, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := exec.Command("sbatch", "--parsable", "-n", "2", "-o", outFile, "--chdir", dir, file).Output()
		if err != nil {
			t.Fatalf("sbatch: %v", err)
		}
		job := strings.TrimSpace(string(b))
		out := func() string { b, _ := os.ReadFile(outFile); return string(b) }
		for deadline := time.Now().Add(30 * time.Second); strings.Count(out(), "] started") < 2; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				exec.Command("scancel", job).Run()
				t.Fatalf("the job's workers did not start:\n%s", out())
			}
		}
		if b, err := exec.Command("scancel", job).CombinedOutput(); err != nil {
			t.Fatalf("scancel: %v\n%s", err, b)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			b, _ := exec.Command("squeue", "-h", "-j", job).Output()
			if strings.TrimSpace(string(b)) == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s still queued 30 s after scancel:\n%s", job, out())
			}
		}
		// Slurm signals every process of its steps, the workers too, and
		// their agents pass vlink launch's on: a worker may print twice.
		for r := range 2 {
			if !strings.Contains(out(), fmt.Sprintf("[%d] got TERM", r)) {
				t.Errorf("rank %d did not get SIGTERM; the job's output:\n%s", r, out())
			}
		}
	})
}

// BenchmarkLaunchSlurm measures how long vlink launch takes to start a
// job of 4 workers as a Slurm step that each join the job's network
// (launch.Join) and exit, against srun starting the same program (told
// only to start and exit), inside one allocation (salloc -n 4), in
// interleaved rounds: the median of each and their ratio.
func BenchmarkLaunchSlurm(b *testing.B) {
	startSlurm(b)
	worker := buildWorker(b)
	rounds := max(b.N, 3)
	script := fmt.Sprintf(`for i in $(seq %d); do
  t0=$(date +%%s%%N); %s launch -- %s join >/dev/null || exit 1
  t1=$(date +%%s%%N); srun -n 4 %s start >/dev/null || exit 1
  t2=$(date +%%s%%N); echo "round $((t1 - t0)) $((t2 - t1))"
done`, rounds, vlinkBin, worker, worker)
	b.ResetTimer()
	out, err := exec.Command("salloc", "-n", "4", "sh", "-c", script).CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("salloc: %v\n%s", err, out)
	}
	var launch, srun []time.Duration
	for line := range strings.Lines(string(out)) {
		var a, c int64
		if _, err := fmt.Sscanf(line, "round %d %d", &a, &c); err == nil {
			launch, srun = append(launch, time.Duration(a)), append(srun, time.Duration(c))
		}
	}
	if len(launch) != rounds {
		b.Fatalf("%d rounds of %d in the output:\n%s", len(launch), rounds, out)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	med := func(v []time.Duration) time.Duration { slices.Sort(v); return v[len(v)/2] }
	ml, ms2 := med(launch), med(srun)
	b.Logf("launch median %7.1f ms (min %.1f .. max %.1f), %d rounds", ms(ml), ms(launch[0]), ms(launch[len(launch)-1]), rounds)
	b.Logf("srun   median %7.1f ms (min %.1f .. max %.1f)", ms(ms2), ms(srun[0]), ms(srun[len(srun)-1]))
	b.ReportMetric(ms(ml), "launch-ms")
	b.ReportMetric(ms(ms2), "srun-ms")
	b.ReportMetric(float64(ml)/float64(ms2), "ratio")
}

// BenchmarkLaunchSlurmAllToAll measures an all-to-all among the 4
// workers of a Slurm job on one node (each rank sends 100 MB to every
// other at once; integration/bench/launch_a2a.sh does the same with the
// local spawner): over shared memory, vlink launch's default for ranks
// of one host, against --shm=false, where they go through the job's
// network (spliced TCP, encrypted), in interleaved rounds inside one
// allocation (see logAllToAll).
func BenchmarkLaunchSlurmAllToAll(b *testing.B) {
	startSlurm(b)
	worker := buildWorker(b)
	const n, bytes = 4, 100_000_000
	rounds := max(b.N, 3)
	script := fmt.Sprintf(`for i in $(seq %d); do
  echo "run shm"; %[2]s launch -- %[3]s a2a %[4]d || exit 1
  echo "run network"; %[2]s launch --shm=false -- %[3]s a2a %[4]d || exit 1
done`, rounds, vlinkBin, worker, bytes)
	b.ResetTimer()
	out, err := exec.Command("salloc", "-n", fmt.Sprint(n), "sh", "-c", script).CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("salloc: %v\n%s", err, out)
	}
	runs := map[string][]a2aRun{}
	for chunk := range strings.SplitSeq(string(out), "run ") {
		path, rest, _ := strings.Cut(chunk, "\n")
		if path != "shm" && path != "network" {
			continue
		}
		r, err := parseAllToAll(rest, n)
		if err != nil {
			b.Fatalf("%s: %v\n%s", path, err, out)
		}
		runs[path] = append(runs[path], r)
	}
	logAllToAll(b, n, bytes, rounds, runs)
}

// An a2aRun is how an all-to-all of launchworker a2a went: the slowest
// rank's time, and the CPU time of all the ranks, in seconds.
type a2aRun struct{ took, cpu float64 }

// parseAllToAll reads the n ranks' lines of one all-to-all from out.
func parseAllToAll(out string, n int) (a2aRun, error) {
	var r a2aRun
	ranks := 0
	for line := range strings.Lines(out) {
		_, rest, ok := strings.Cut(line, " a2a ")
		if !ok {
			continue
		}
		var moved, peers int
		var took, cpu float64
		if _, err := fmt.Sscanf(rest, "%d bytes to each of %d peers in %g s, cpu %g s", &moved, &peers, &took, &cpu); err != nil {
			return r, fmt.Errorf("%q: %w", line, err)
		}
		r.took, r.cpu, ranks = max(r.took, took), r.cpu+cpu, ranks+1
	}
	if ranks != n {
		return r, fmt.Errorf("%d ranks reported, want %d", ranks, n)
	}
	return r, nil
}

// logAllToAll logs, for the runs over shared memory ("shm") and through
// the job's network ("network"), interleaved: the median aggregate rate
// (n(n-1)bytes over the slowest rank's time) and the CPU seconds per GB
// moved of the n workers, each with its spread, and the ratios of the
// rounds' pairs.
func logAllToAll(b *testing.B, n, bytes, rounds int, runs map[string][]a2aRun) {
	if len(runs["shm"]) != rounds || len(runs["network"]) != rounds {
		b.Fatalf("%d and %d runs, want %d of each", len(runs["shm"]), len(runs["network"]), rounds)
	}
	gb := float64(n*(n-1)*bytes) / 1e9
	med := func(v []float64) (m, lo, hi float64) {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2], v[0], v[len(v)-1]
	}
	for _, p := range []string{"shm", "network"} {
		var rate, cpu []float64
		for _, r := range runs[p] {
			rate, cpu = append(rate, gb*8/r.took), append(cpu, r.cpu/gb)
		}
		m, lo, hi := med(rate)
		c, clo, chi := med(cpu)
		b.Logf("%-8s %6.2f Gbit/s aggregate (%.2f..%.2f), %.2f CPU s/GB (%.2f..%.2f), %d rounds", p, m, lo, hi, c, clo, chi, rounds)
		b.ReportMetric(m, p+"-Gbit/s")
	}
	var ratio, cpuRatio []float64
	for i := range rounds {
		s, t := runs["shm"][i], runs["network"][i]
		ratio, cpuRatio = append(ratio, t.took/s.took), append(cpuRatio, s.cpu/t.cpu)
	}
	m, lo, hi := med(ratio)
	c, clo, chi := med(cpuRatio)
	b.Logf("shm/network: rate %.2fx (%.2f..%.2f), CPU per GB %.2fx (%.2f..%.2f)", m, lo, hi, c, clo, chi)
}

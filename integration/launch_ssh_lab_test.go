//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/lab"
	"github.com/vlink-dev/vlink/internal/realserver"
)

// sshJobLab is the lab of the ssh spawner's tests: vlink launch runs on
// host l; OpenSSH's sshd runs on s1, and on s2 behind fw, a firewall
// that lets nothing in but SSH. So a worker on s1 cannot connect to one
// on s2: the job needs the relay's path (or a reverse or spliced one).
type sshJobLab struct {
	*lab.Lab
	servers string           // --ssh-servers
	options string           // --ssh-options
	sshd    map[string]*proc // by host

	user, identity, knownHosts string
}

// rtt, when not 0, is the round trip between l and each server.
func newSSHJobLab(t testing.TB, rtt time.Duration) *sshJobLab {
	lab.Require(t, "nft", "sshd", "pgrep")
	l := lab.New(t, lab.Topology{
		Name:    "job",
		Hosts:   []lab.Host{{Name: "s1"}, {Name: "l"}, {Name: "fw", Firewall: &lab.Firewall{Trust: []string{"s2"}, Open: []string{"tcp/22"}}}, {Name: "s2"}},
		Links:   []lab.Link{{A: "s1", B: "l", RTT: lab.Duration(rtt)}, {A: "l", B: "fw", RTT: lab.Duration(rtt)}, {A: "fw", B: "s2"}},
		Sysctls: lab.TCPSysctls,
	})
	if tt, ok := t.(*testing.T); ok {
		checkUnreachable(tt, l, "s1", "s2", "fw")
	}
	j := &sshJobLab{Lab: l, sshd: map[string]*proc{}}
	var known []byte
	var first *realserver.SSHD
	var servers []string
	for _, h := range []string{"s1", "s2"} {
		// The servers are namespaces of one machine, sharing its /tmp: a
		// temporary folder of each server's own keeps their workers from
		// finding each other over shared memory, as on two machines.
		tmp := filepath.Join(t.TempDir(), h)
		if err := os.Mkdir(tmp, 0o700); err != nil {
			t.Fatal(err)
		}
		s := realserver.PrepareSSHD(t, realserver.SSHDOptions{Forwarding: true, Config: "SetEnv TMPDIR=" + tmp}, l.Addr(h).String(), 22)
		kh, err := os.ReadFile(s.KnownHosts)
		if err != nil {
			t.Fatal(err)
		}
		known = append(known, kh...)
		if first == nil {
			first = s
		} else {
			// One user key logs in everywhere, as a cluster's does.
			ak := filepath.Join(s.Dir, "authorized_keys")
			if err := os.WriteFile(ak, []byte(first.UserKey.AuthorizedLine+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p := labProc(t, l, h, s.Program, "-D", "-e", "-f", s.ConfigFile)
		waitLabListening(t, l, p, h, 22)
		j.sshd[h] = p
		servers = append(servers, s.Host)
	}
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(knownHosts, known, 0o600); err != nil {
		t.Fatal(err)
	}
	j.servers = strings.Join(servers, " ")
	j.user, j.identity, j.knownHosts = first.User, first.UserKey.Private, knownHosts
	j.options = fmt.Sprintf("user=%s,identity=%s,known-hosts=%s,config=none,agent=false", first.User, first.UserKey.Private, knownHosts)
	return j
}

// launch starts vlink launch on l with the ssh spawner.
func (j *sshJobLab) launch(t testing.TB, n int, args ...string) *proc {
	return labProc(t, j.Lab, "l", vlinkBin, append([]string{"launch", "-n", fmt.Sprint(n), "--grace", "1s",
		"--ssh-servers", j.servers, "--ssh-options", j.options}, args...)...)
}

// cutSSH kills the processes of host's sshd that carry its logged-in
// connections, and only them: the connections drop, as when a network
// fails, and what the sessions ran is left to notice on its own.
func (j *sshJobLab) cutSSH(t *testing.T, host string) {
	t.Helper()
	n := 0
	for _, pid := range realserver.Descendants(j.sshd[host].Pid()) {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.HasPrefix(string(comm), "sshd") {
			syscall.Kill(pid, syscall.SIGKILL)
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no sshd session on %s to cut", host)
	}
}

// TestLaunchSSH: the ssh spawner starts 4 workers on two servers, one
// behind a firewall that lets only SSH in; they exchange bytes all to
// all, checked by SHA-256: through the job's network between servers,
// over shared memory between the two ranks of a server. An SSH connection
// that drops fails the job, naming a rank it lost, and leaves nothing
// running on either server; so does vlink launch killed with SIGKILL.
func TestLaunchSSH(t *testing.T) {
	j := newSSHJobLab(t, 0)
	worker := buildWorker(t)
	t.Run("all to all", func(t *testing.T) {
		p := j.launch(t, 4, "--", worker)
		p.Strict = false
		select {
		case <-p.Done():
		case <-time.After(2 * time.Minute):
			t.Fatalf("vlink launch still runs after 2 minutes:\n%s", p.Output())
		}
		if p.Err() != nil {
			t.Fatalf("vlink launch: %v\n%s", p.Err(), p.Output())
		}
		for r := range 4 {
			for _, line := range []string{fmt.Sprintf("[%d] rank %d: all 3 peers ok\n", r, r), fmt.Sprintf("[%d] rank %d: dialed 3 peers: shm 1, network 2\n", r, r)} {
				if !strings.Contains(p.Output(), line) {
					t.Errorf("no %q in the output:\n%s", line, p.Output())
				}
			}
		}
	})
	marker := fmt.Sprintf("306.%d", time.Now().UnixNano()%1e6)
	script := `echo started on $(hostname) in "$VLINK_NODE"; sleep ` + marker + ` & wait`
	started := regexp.MustCompile(`\] started on `)
	t.Run("hostfile", func(t *testing.T) {
		// The first server takes 3 slots: ranks 0-2 run there, rank 3 on
		// the second, as mpirun maps by slot. sshd tells a session its
		// server's address (SSH_CONNECTION), and --tag-host names it.
		hosts := strings.Fields(j.servers)
		file := filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(file, []byte("# the lab\n"+hosts[0]+" slots=3\n"+hosts[1]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := labProc(t, j.Lab, "l", vlinkBin, "launch", "-n", "4", "--hostfile", file, "--ssh-options", j.options, "--tag-host", "--",
			"sh", "-c", `set -- $SSH_CONNECTION; echo "on $3"`)
		p.Strict = false
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs:\n%s", p.Output())
		}
		for r, host := range []string{hosts[0], hosts[0], hosts[0], hosts[1]} {
			addr := host[strings.LastIndexByte(host, '@')+1:]
			if line := fmt.Sprintf("[%d@%s] on %s\n", r, addr, addr); p.Err() != nil || !strings.Contains(p.Output(), line) {
				t.Errorf("vlink launch: %v; no %q in its output:\n%s", p.Err(), line, p.Output())
			}
		}
	})
	t.Run("exported variables", func(t *testing.T) {
		// The servers' sessions carry none of this machine's
		// environment: -x is how a variable reaches remote ranks.
		t.Setenv("VLINK_TEST_FROM_HERE", "by name")
		p := j.launch(t, 2, "-x", "VLINK_TEST_FROM_HERE", "-x", "VLINK_TEST_X=by value", "--", "sh", "-c",
			`echo "x=$VLINK_TEST_X, here=$VLINK_TEST_FROM_HERE"`)
		p.Strict = false
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs:\n%s", p.Output())
		}
		for r := range 2 {
			if line := fmt.Sprintf("[%d] x=by value, here=by name\n", r); p.Err() != nil || !strings.Contains(p.Output(), line) {
				t.Errorf("vlink launch: %v; no %q in its output:\n%s", p.Err(), line, p.Output())
			}
		}
	})
	t.Run("nothing escapes", func(t *testing.T) {
		// The agents here run where no cgroup can be made (the lab's
		// hosts have a /sys of their own): each holds its worker's
		// processes as their subreaper, and a setsid escapes none.
		p := j.launch(t, 2, "--log-level", "info", "--", "sh", "-c", `setsid sleep `+marker+`9 & sleep 0.3`)
		p.Strict = false
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs:\n%s", p.Output())
		}
		if p.Err() != nil || !strings.Contains(p.Output(), "held by vlink launch as their subreaper") {
			t.Fatalf("vlink launch: %v, and the agents' log should say the subreaper holds the job:\n%s", p.Err(), p.Output())
		}
		waitGone(t, "^sleep "+marker+"9")
	})
	t.Run("a rank fails at once", func(t *testing.T) {
		// Rank 0 fails before other ranks' agents said hello: they must
		// get the SIGTERM too, not be killed only after the grace.
		for range 3 {
			start := time.Now()
			p := labProc(t, j.Lab, "l", vlinkBin, "launch", "-n", "4", "--grace", "20s", "--join-timeout", "0",
				"--ssh-servers", j.servers, "--ssh-options", j.options, "--",
				"sh", "-c", `test "$VLINK_RANK" != 0 || exit 3; sleep `+marker+`7`)
			p.Strict = false
			select {
			case <-p.Done():
			case <-time.After(30 * time.Second):
				t.Fatalf("vlink launch still runs:\n%s", p.Output())
			}
			var ee *exec.ExitError
			if took := time.Since(start); !errors.As(p.Err(), &ee) || ee.ExitCode() != 3 || took > 10*time.Second {
				t.Fatalf("exit: %v after %v, want status 3 well within the 20 s grace:\n%s", p.Err(), took, p.Output())
			}
			waitGone(t, "^sleep "+marker+"7")
		}
	})
	t.Run("an ssh connection drops", func(t *testing.T) {
		p := j.launch(t, 4, "--join-timeout", "0", "--", "sh", "-c", script)
		p.Strict = false
		waitCount(t, p, started, 4, startTimeout)
		if n := waitLeftovers(t, "^sleep "+marker, 4); n != 4 {
			t.Fatalf("%d workers' sleeps running, want 4", n)
		}
		ours := j.jobPids()
		j.cutSSH(t, "s2")
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs after its ssh connection to s2 dropped:\n%s", p.Output())
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit: %v, want status 1", p.Err())
		}
		if !regexp.MustCompile(`vlink launch: rank [13] was lost with the ssh connection to ` + regexp.QuoteMeta(j.Addr("s2").String())).MatchString(p.Output()) {
			t.Errorf("the job's failure does not name a rank of s2 lost with its connection:\n%s", p.Output())
		}
		waitGone(t, "^sleep "+marker)
		waitPidsGone(t, ours)
	})
	t.Run("SIGTERM", func(t *testing.T) {
		p := j.launch(t, 4, "--join-timeout", "0", "--", "sh", "-c",
			`trap 'echo got TERM; exit 3' TERM; `+script)
		p.Strict = false
		waitCount(t, p, started, 4, startTimeout)
		ours := j.jobPids()
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
		if n := strings.Count(p.Output(), "] got TERM"); n != 4 {
			t.Errorf("%d workers got SIGTERM, want 4; output:\n%s", n, p.Output())
		}
		waitGone(t, "^sleep "+marker)
		waitPidsGone(t, ours)
	})
	t.Run("a worker fails", func(t *testing.T) {
		p := j.launch(t, 4, "--join-timeout", "0", "--", "sh", "-c",
			`if [ "$VLINK_RANK" = 3 ]; then sleep 0.5; echo failing; exit 7; fi; `+script)
		p.Strict = false
		waitCount(t, p, started, 3, startTimeout)
		ours := j.jobPids()
		select {
		case <-p.Done():
		case <-time.After(time.Minute):
			t.Fatalf("vlink launch still runs a minute after rank 3 failed:\n%s", p.Output())
		}
		var ee *exec.ExitError
		if !errors.As(p.Err(), &ee) || ee.ExitCode() != 7 {
			t.Errorf("exit: %v, want status 7 (rank 3's)", p.Err())
		}
		if want := "vlink launch: rank 3 exited with status 7 on " + j.Addr("s2").String(); !strings.Contains(p.Output(), want) {
			t.Errorf("no %q in the output:\n%s", want, p.Output())
		}
		waitGone(t, "^sleep "+marker)
		waitPidsGone(t, ours)
	})
	t.Run("an agent is killed", func(t *testing.T) {
		p := j.launch(t, 4, "--join-timeout", "0", "--", "sh", "-c", script)
		p.Strict = false
		waitCount(t, p, started, 4, startTimeout)
		// One of s2's agents, killed as the OOM killer would: the kernel
		// kills its worker, its guard what the worker started. The
		// job's agents and guards are known by their process ids, as
		// other tests' may run meanwhile.
		ours := j.jobPids()
		var agent int
		for _, pid := range realserver.Descendants(j.sshd["s2"].Pid()) {
			if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmdline), "--worker") {
				agent = pid
				break
			}
		}
		if agent == 0 {
			t.Fatal("no agent under s2's sshd")
		}
		syscall.Kill(agent, syscall.SIGKILL)
		select {
		case <-p.Done():
		case <-time.After(startTimeout):
			t.Fatalf("vlink launch still runs after an agent was killed:\n%s", p.Output())
		}
		if !regexp.MustCompile(`vlink launch: rank [13] ended on ` + regexp.QuoteMeta(j.Addr("s2").String()) + ` without a word from its agent`).MatchString(p.Output()) {
			t.Errorf("the job's failure does not name the rank whose agent was killed:\n%s", p.Output())
		}
		waitGone(t, "^sleep "+marker)
		waitPidsGone(t, ours)
	})
	t.Run("vlink launch is killed", func(t *testing.T) {
		p := j.launch(t, 4, "--join-timeout", "0", "--", "sh", "-c", script)
		waitCount(t, p, started, 4, startTimeout)
		ours := j.jobPids()
		p.Kill()
		waitGone(t, "^sleep "+marker)
		waitPidsGone(t, ours)
	})
}

// jobPids returns the process ids of the agents and guards under the
// servers' sshd: the running job's, told apart from other tests' by
// where they run.
func (j *sshJobLab) jobPids() []int {
	var pids []int
	for _, server := range []string{"s1", "s2"} {
		for _, pid := range realserver.Descendants(j.sshd[server].Pid()) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if bytes.Contains(cmdline, []byte("--worker")) || bytes.Contains(cmdline, []byte("--guard")) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// waitPidsGone waits until none of pids runs (a zombie has ended).
func waitPidsGone(t *testing.T, pids []int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var left []string
		for _, pid := range pids {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if i := strings.LastIndexByte(string(stat), ')'); err == nil && i > 0 && !strings.HasPrefix(string(stat[i+1:]), " Z") {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				left = append(left, fmt.Sprintf("%d (%s)", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the job are left behind: %s", strings.Join(left, ", "))
		}
	}
}

// BenchmarkLaunchSSH measures how long vlink launch takes to start a job
// of 4 workers on two servers over SSH, 10 ms away, the workers joining
// the job's network (launch.Join) and exiting, against OpenSSH starting
// the same program (told only to start and exit) on the same servers
// from a plain shell loop, one ssh per worker in parallel. Rounds are
// interleaved; run with -benchtime Nx for N rounds. Needs root.
func BenchmarkLaunchSSH(b *testing.B) {
	const n = 4
	j := newSSHJobLab(b, 10*time.Millisecond)
	worker := buildWorker(b)
	servers := strings.Fields(j.servers)
	sshArgs := []string{"-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", j.identity,
		"-o", "UserKnownHostsFile=" + j.knownHosts, "-o", "StrictHostKeyChecking=yes", "-l", j.user}
	loop := "for s in"
	for r := range n {
		loop += " " + servers[r%len(servers)]
	}
	loop += fmt.Sprintf(`; do ssh %s "$s" %s start & done; wait`, strings.Join(sshArgs, " "), worker)
	runs := map[string][]string{
		"launch": {vlinkBin, "launch", "-n", fmt.Sprint(n), "--ssh-servers", j.servers, "--ssh-options", j.options, "--", worker, "join"},
		"ssh":    {"sh", "-c", loop},
	}
	took := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, k := range [][]string{{"launch", "ssh"}, {"ssh", "launch"}}[i%2] {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			start := time.Now()
			out, err := j.CommandContext(ctx, "l", runs[k][0], runs[k][1:]...).CombinedOutput()
			took[k] = append(took[k], time.Since(start))
			cancel()
			if err != nil {
				b.Fatalf("%s: %v\n%s", k, err, out)
			}
		}
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	med := map[string]time.Duration{}
	for _, k := range []string{"launch", "ssh"} {
		slices.Sort(took[k])
		med[k] = took[k][len(took[k])/2]
		b.ReportMetric(ms(med[k]), k+"-ms")
		b.Logf("%-6s median %7.1f ms  (min %.1f .. max %.1f), %d rounds", k, ms(med[k]), ms(took[k][0]), ms(took[k][len(took[k])-1]), len(took[k]))
	}
	b.ReportMetric(float64(med["launch"])/float64(med["ssh"]), "ratio")
}

// BenchmarkLaunchSSHAllToAll measures an all-to-all among 4 workers
// started by the ssh spawner, two on each server (each rank sends 20 MB
// to every other at once): with the ranks of a server over shared
// memory, vlink launch's default, against --shm=false, where every pair
// goes through the job's network (between servers, through the relay on
// l over each server's SSH connection, as the firewall leaves no other
// way), in interleaved rounds (see logAllToAll).
func BenchmarkLaunchSSHAllToAll(b *testing.B) {
	const n, bytes = 4, 20_000_000
	j := newSSHJobLab(b, 0)
	worker := buildWorker(b)
	rounds := max(b.N, 3)
	runs := map[string][]a2aRun{}
	b.ResetTimer()
	for i := range rounds {
		for _, p := range [][]string{{"shm", "network"}, {"network", "shm"}}[i%2] {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			out, err := j.CommandContext(ctx, "l", vlinkBin, "launch", "-n", fmt.Sprint(n), "--ssh-servers", j.servers, "--ssh-options", j.options,
				"--shm="+fmt.Sprint(p == "shm"), "--", worker, "a2a", fmt.Sprint(bytes)).CombinedOutput()
			cancel()
			if err != nil {
				b.Fatalf("%s: %v\n%s", p, err, out)
			}
			r, err := parseAllToAll(string(out), n)
			if err != nil {
				b.Fatalf("%s: %v\n%s", p, err, out)
			}
			runs[p] = append(runs[p], r)
		}
	}
	b.StopTimer()
	logAllToAll(b, n, bytes, rounds, runs)
}

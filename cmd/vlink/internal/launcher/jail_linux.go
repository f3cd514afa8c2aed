package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/procs"
)

// A jail holds every process a job's workers start, so that none
// outlives the job: not one that calls setsid, nor a daemon that forks
// twice, which leave the worker's process group. It is a cgroup v2 of
// the job's own where this process may make one: workers start inside it
// (clone3's CLONE_INTO_CGROUP, so not even a fork at once escapes), and
// cgroup.kill ends all of it. Where it may not (no cgroup2 mount, or no
// right to write under this process's cgroup), vlink launch becomes the
// subreaper of its descendants instead: orphans become its children,
// which it stops when the job ends; but should vlink launch itself be
// killed they go to init, beyond reach.
type jail struct {
	dir      string // the cgroup's folder; "" with the subreaper
	fd       int    // open on dir, for CLONE_INTO_CGROUP
	guardPid int    // a child of ours that is not the job's

	// With the subreaper, orphans that exit are ours to reap, or they
	// stay zombies in their process group for as long as we run. The
	// workers are not: exec.Cmd reaps them, with their status.
	mu      sync.Mutex
	workers map[int]bool
	done    chan struct{}
}

var jailSeq atomic.Int32

// holdJob makes the jail of a job's processes, tells its guard, and
// says in the log how they are held.
func holdJob(e *base.Env, g *guard) *jail {
	j, why := newJail(g.pid())
	switch {
	case j == nil:
		e.Log.Warn("the job's processes are not held: one that leaves its worker's process group (setsid, a daemon) may outlive the job", "err", why)
		return nil
	case j.dir == "":
		e.Log.Info("the job's processes are held by vlink launch as their subreaper (no cgroup of the job's own could be made)", "cgroup", why)
	default:
		g.cgroup(j.dir)
		e.Log.Info("the job's processes are held in a cgroup of its own", "cgroup", j.dir)
	}
	return j
}

// newJail makes the job's cgroup, or becomes the subreaper of all but
// guardPid, a child of ours that is not the job's; why says what failed
// of the cgroup, or of both when it returns nil.
func newJail(guardPid int) (j *jail, why error) {
	dir, err := ownCgroup()
	if err == nil {
		dir = filepath.Join(dir, fmt.Sprintf("vlink-launch-%d-%d", os.Getpid(), jailSeq.Add(1)))
		if err = os.Mkdir(dir, 0o755); err == nil {
			var fd int
			if fd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
				j := &jail{dir: dir, fd: fd}
				if err = j.probe(); err == nil {
					return j, nil
				}
				unix.Close(fd)
			}
			os.Remove(dir)
		}
	}
	if perr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); perr != nil {
		return nil, fmt.Errorf("no cgroup (%w) and no subreaper (%w)", err, perr)
	}
	j = &jail{fd: -1, guardPid: guardPid, workers: map[int]bool{}, done: make(chan struct{})}
	go j.reap()
	return j, err
}

// reap reaps the orphans that exited, as SIGCHLD says a child did (and
// every second, for a signal merged with another), until the jail is
// stopped.
func (j *jail) reap() {
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	defer signal.Stop(child)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-j.done:
			return
		case <-child:
		case <-t.C:
		}
		j.mu.Lock()
		for _, pid := range procs.Zombies(os.Getpid()) {
			if !j.workers[pid] && pid != j.guardPid {
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
		}
		j.mu.Unlock()
	}
}

// probe starts a process in the cgroup: the kernel may refuse (older
// than clone3's CLONE_INTO_CGROUP, 5.7, or the cgroup's place in the tree
// holds no processes), and then the job is better held otherwise.
func (j *jail) probe() error {
	cmd := exec.Command("/bin/sh", "-c", "exit 0")
	if err := j.start(cmd); err != nil {
		return fmt.Errorf("starting a process in it: %w", err)
	}
	return cmd.Wait()
}

// ownCgroup returns the folder of this process's cgroup v2.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var rel string
	found := false
	for line := range strings.Lines(string(b)) {
		if r, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel, found = r, true
		}
	}
	if !found {
		return "", errors.New("this process is in no cgroup v2")
	}
	mount, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	return filepath.Join(mount, rel), nil
}

// cgroup2Mount returns where the cgroup2 file system is mounted:
// /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent dev root mountpoint options ... - fstype source ...
		fields := strings.Fields(sc.Text())
		for i, v := range fields {
			if v == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	return "", errors.New("no cgroup2 file system is mounted")
}

// start starts cmd inside the jail (nil: none).
func (j *jail) start(cmd *exec.Cmd) error {
	switch {
	case j == nil:
	case j.dir != "":
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, j.fd
	default: // the subreaper's
		// Known as a worker before it can exit, so reap never takes
		// its status from exec.Cmd.
		j.mu.Lock()
		defer j.mu.Unlock()
		if err := cmd.Start(); err != nil {
			return err
		}
		j.workers[cmd.Process.Pid] = true
		return nil
	}
	return cmd.Start()
}

func cgroupProcs(dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// orphans returns this process's children but the guard: with the
// subreaper, once the workers have ended, what they left.
func (j *jail) orphans() []int {
	var pids []int
	for _, pid := range procs.Children(os.Getpid()) {
		if pid != j.guardPid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stop ends what is left in the jail once the job's workers have ended:
// SIGTERM, then SIGKILL after grace, and removes the cgroup.
func (j *jail) stop(grace time.Duration) {
	switch {
	case j == nil:
	case j.dir != "":
		unix.Close(j.fd)
		endCgroup(j.dir, grace)
	default:
		endProcs(j.orphans, grace, func(pids []int) {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		close(j.done)
	}
}

// endCgroup ends a job's cgroup, at the job's end or, for the guard,
// once vlink launch is gone: SIGTERM, cgroup.kill after grace, removed.
// Only a vlink-launch- cgroup.
func endCgroup(dir string, grace time.Duration) {
	if !strings.HasPrefix(filepath.Base(dir), "vlink-launch-") {
		return
	}
	endProcs(func() []int { return cgroupProcs(dir) }, grace, func([]int) {
		os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	})
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return // removable once its killed processes are gone
		}
	}
}

// endProcs sends SIGTERM to what list returns, waits up to grace for it
// to be gone, and kills what is left.
func endProcs(list func() []int, grace time.Duration, kill func([]int)) {
	left := list()
	if len(left) == 0 {
		return
	}
	for _, pid := range left {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(grace); time.Now().Before(deadline) && len(left) > 0; left = list() {
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		kill(left)
	}
}

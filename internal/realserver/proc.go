//go:build linux

package realserver

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/procnet"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// Timeouts of a test's processes, generous since CI machines are shared.
const (
	StartTimeout = 15 * time.Second // a process is listening
	StopTimeout  = 5 * time.Second  // a Strict process exits after SIGTERM
)

// A Proc is a program started for a test, in its own process group so
// that cleanup reaches the children it forks (socat forks one per
// connection, sshd one per session).
type Proc struct {
	Name string
	Cmd  *exec.Cmd

	// What Stop checks besides stopping the process. The zero value
	// checks nothing, which suits a server the test merely uses.
	//
	// Strict: the test owns the process's whole life, so exiting before
	// Stop, or running on for StopTimeout after SIGTERM, fails the test.
	Strict bool
	// CleanExit: SIGTERM must end the process with status 0 (vlink's
	// contract for its commands).
	CleanExit bool
	// Ports must no longer listen once the process stopped.
	Ports []int

	out    *testnet.Buffer // stdout and stderr
	done   chan struct{}
	err    error // from Wait, once done is closed
	once   sync.Once
	killed bool
}

// Start starts a program and registers its cleanup, Stop. The output is
// logged if the test failed.
func Start(tb testing.TB, name string, args ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(name, args...)
	p := &Proc{Name: filepath.Base(name), Cmd: cmd, out: &testnet.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// A descendant that escaped the group must not hold Wait forever.
	cmd.WaitDelay = StopTimeout
	// Pdeathsig: a test binary killed by its timeout takes them along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() { p.Stop(tb) })
	return p
}

func (p *Proc) String() string { return fmt.Sprintf("%s (pid %d)", p.Name, p.Pid()) }

// Pid is the process's id, which is also its group's.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Output returns what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended (exec.Cmd.Wait's error), once Done is
// closed.
func (p *Proc) Err() error { return p.err }

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to the process itself, for a test that ends it on
// purpose: Stop then checks nothing about how it ended.
func (p *Proc) Kill() {
	p.killed = true
	p.Cmd.Process.Signal(syscall.SIGKILL)
}

// Stop ends the process group: SIGTERM to the group and to every
// descendant (sshd's sessions call setsid, so the group does not reach
// them), SIGKILL if they linger. Then it checks what Strict, CleanExit
// and Ports ask. Only the first call does anything; cleanup calls it again.
func (p *Proc) Stop(tb testing.TB) {
	tb.Helper()
	p.once.Do(func() { p.stop(tb) })
}

func (p *Proc) stop(tb testing.TB) {
	tb.Helper()
	pgid := p.Pid()
	exitedEarly := !p.Running()
	// Take the whole tree now, before the children are orphaned, with
	// each one's start time: a pid seen again later is the same process
	// only if it started at the same time.
	tree := Descendants(pgid)
	started := make(map[int]string, len(tree))
	for _, pid := range tree {
		started[pid] = startTime(pid)
	}
	// The processes the tree makes from now on are in no list: a daemon
	// whose sessions the signals below end is reconnected to at once,
	// and may start a session for the client before it ends itself
	// (sshd did, under load: the new session, in a session of its own,
	// kept a port it forwards open after the test stopped sshd). They
	// still write to the process's output, which names them.
	output := outputOf(pgid)
	sweep := func() {
		for _, pid := range holdersOf(output) {
			if _, listed := started[pid]; !listed && pid != pgid && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	signal := func(sig syscall.Signal) {
		syscall.Kill(-pgid, sig)
		for _, pid := range tree {
			syscall.Kill(pid, sig)
		}
	}
	signal(syscall.SIGTERM)
	grace := time.Second // the children hold the output open: Wait waits for them too
	if p.Strict {
		grace = StopTimeout
	}
	timeout := time.After(grace)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-p.done:
			break wait
		case <-tick.C:
			sweep()
		case <-timeout:
			if p.Strict && !p.killed {
				tb.Errorf("%s ignored SIGTERM for %v; killing it", p, grace)
			}
			signal(syscall.SIGKILL)
			sweep()
			timeout = nil
		}
	}
	// Children that outlived the leader: those in its group, and those
	// that left it (a daemon's per-connection processes call setsid),
	// which would otherwise outlive the test with what they hold open:
	// an sshd session and the ports it forwards, say.
	syscall.Kill(-pgid, syscall.SIGKILL)
	for _, pid := range tree {
		if s := startTime(pid); s != "" && s == started[pid] {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	switch {
	case p.killed:
	case exitedEarly && p.Strict:
		tb.Errorf("%s exited before the test ended: %v", p, p.err)
	case p.CleanExit && p.err != nil:
		tb.Errorf("%s on SIGTERM: %v, want exit status 0", p, p.err)
	}
	for _, port := range p.Ports {
		if pid := holder(port, tree, started); pid != 0 {
			tb.Errorf("%s stopped but port %d is still listening, held by pid %d of its tree", p, port, pid)
		}
	}
	if tb.Failed() {
		tb.Logf("output of %s:\n%s", p, Tail(p.out.String(), 6000))
	}
}

// holder returns a process of the stopped tree that still holds a socket
// listening on port, once the processes killed had a second to go; 0 if
// none does. A listener of another process is not a leak: tests running in
// parallel may be handed the port the moment it is free.
func holder(port int, tree []int, started map[int]string) int {
	deadline := time.Now().Add(time.Second)
	for {
		inodes := procnet.TCPListeners(port)
		if len(inodes) == 0 {
			return 0
		}
		pid := 0
		for _, t := range tree {
			if s := startTime(t); s != "" && s == started[t] && procnet.Holds(t, inodes) {
				pid = t
				break
			}
		}
		if pid == 0 || time.Now().After(deadline) {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitFor waits until the output matches re and returns the submatches.
func (p *Proc) WaitFor(tb testing.TB, re *regexp.Regexp, timeout time.Duration) []string {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m
		}
		if !p.Running() {
			tb.Fatalf("%s exited (%v) before printing %q; output:\n%s", p, p.err, re, Tail(p.out.String(), 4000))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not print %q within %v; output:\n%s", p, re, timeout, Tail(p.out.String(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitListening waits until a socket listens on port in the calling
// thread's network namespace. It reads the kernel's socket table rather
// than connecting, which servers such as iperf3 would take for a client
// and sshd for a login.
func (p *Proc) WaitListening(tb testing.TB, port int) {
	tb.Helper()
	deadline := time.Now().Add(StartTimeout)
	for !procnet.TCPListening(port) {
		if !p.Running() {
			tb.Fatalf("%s exited (%v) before listening on %d; output:\n%s", p, p.err, port, Tail(p.out.String(), 4000))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not listening on %d after %v; output:\n%s", p, port, StartTimeout, Tail(p.out.String(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitListening is WaitListening for a host:port.
func (p *Proc) waitListening(tb testing.TB, addr string) {
	tb.Helper()
	p.WaitListening(tb, Port(tb, addr))
}

// Port returns the port of a host:port address.
func Port(tb testing.TB, addr string) int {
	tb.Helper()
	_, ps, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		tb.Fatal(err)
	}
	return port
}

// Descendants lists the processes below pid, from /proc.
func Descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// outputOf returns what the process's standard output is (its
// /proc/PID/fd/1 link: "pipe:[INODE]" for a Proc), or "" if it is gone.
func outputOf(pid int) string {
	link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", pid))
	if err != nil || !strings.HasPrefix(link, "pipe:") {
		return ""
	}
	return link
}

// holdersOf lists the processes with output, a pipe, open as standard
// output or error.
func holdersOf(output string) []int {
	if output == "" {
		return nil
	}
	dirs, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		for _, fd := range []string{"1", "2"} {
			if link, _ := os.Readlink("/proc/" + d.Name() + "/fd/" + fd); link == output {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// startTime returns a process's start time (field 22 of /proc/PID/stat),
// or "" if it is gone.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19] // field 22: fields 3.. start at f[0]
}

// Tail returns the last n bytes of s, marked as cut if they are not all.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[...]\n" + s[len(s)-n:]
}

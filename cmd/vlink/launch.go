package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/launch"
)

var launchCmd = &cli.Command{
	Name:     "launch",
	Summary:  "start a job of N processes that reach each other by rank over a vlink network",
	Synopsis: "-n N [flags] -- PROGRAM [ARGS...]",
	About: `
Starts N processes of PROGRAM on this machine, a job, and runs the job's
vlink network: a relay made for the job, with a key of its own that only
the job's processes hold. Each process, a worker, finds in its
environment:

  VLINK_RANK           its rank, 0 to N-1
  VLINK_SIZE           N
  VLINK_NODE           its node name in the job's network: rankR
  VLINK_RELAY          the job's relay, HOST:PORT
  VLINK_NODE_KEY_FILE  its node key, in a file only the user reads,
                       removed when the job ends

A Go program joins with launch.Join (package vlink/launch), which dials
rank R's port P, accepts the other ranks' connections, and waits for
them all at a barrier. Unmodified
programs use the node flags of vlink's commands with these variables:
under vlink exec --node "$VLINK_NODE" --relay "$VLINK_RELAY"
--node-key-file "$VLINK_NODE_KEY_FILE", a program reaches rank R's port P
as rankR.vlink.alt:P, which vlink serve, given the same flags and
--allow localhost:P, exposes on rank R.

Each worker's output goes to vlink's, line by line, after its rank in
brackets ("[3] ..."; --route-output=false passes it through as it is).
The job succeeds when every worker exits 0. Otherwise vlink launch stops
the others (SIGTERM, then SIGKILL after --grace), says which rank failed
and how, and exits with that worker's status (128+N for a signal N). A
worker still running after --join-timeout without having joined fails
the job, and the message names the missing ranks. A worker that exits
without joining does not. SIGINT and SIGTERM reach every worker.

Nothing outlives the job: what a worker leaves running is stopped when
the job ends. If vlink launch itself is killed, the kernel kills the
workers, and a guard process stops what they started and removes the
job's key files. Workers read nothing: their standard input is /dev/null.

Only the local spawner exists so far: every worker runs on this machine.
`,
	Examples: `
  # Four workers, each saying where it is in the job:
  vlink launch -n 4 -- sh -c 'echo "rank $VLINK_RANK of $VLINK_SIZE is $VLINK_NODE"'

  # Eight workers of a Go program that calls launch.Join:
  vlink launch -n 8 -- ./allreduce
`,
	Args: true,
	// The workers' output is the output: vlink launch adds warnings and
	// errors only, unless told otherwise.
	Flags: withEnvAt(slog.LevelWarn, "", launchFlags),
}

type launchOptions struct {
	n                  int
	joinTimeout, grace time.Duration
	listen             string
	routeOutput        bool
	guard              bool
}

func launchFlags(fs *flag.FlagSet) func(context.Context, *env) int {
	o := &launchOptions{}
	fs.IntVar(&o.n, "n", 0, fmt.Sprintf("start `N` workers, 1 to %d (required)", launch.MaxSize))
	fs.DurationVar(&o.joinTimeout, "join-timeout", time.Minute, "fail the job when a worker has run for `DURATION` without joining its network; 0: never")
	fs.DurationVar(&o.grace, "grace", 5*time.Second, "when the job ends early (a worker failed, SIGINT or SIGTERM), give the other workers `DURATION` after SIGTERM before SIGKILL")
	fs.StringVar(&o.listen, "relay-listen", "127.0.0.1:0", "run the job's relay on `ADDR` (host:port)")
	fs.BoolVar(&o.routeOutput, "route-output", true, "prefix each line the workers write with their rank; false: their output passes through unchanged")
	fs.BoolVar(&o.guard, "guard", false, "(internal) be the guard of a launch: see runGuard")
	return func(ctx context.Context, e *env) int {
		if o.guard {
			runGuard(e.stdin, o.grace)
			return exitOK
		}
		err := o.run(ctx, e)
		var jf *jobFailed
		if errors.As(err, &jf) {
			fmt.Fprintf(e.stderr, "vlink launch: %s\n", jf.why)
			return jf.code
		}
		if err != nil {
			return fail(e, "vlink launch", err)
		}
		return exitOK
	}
}

// jobFailed is a job that ended with a worker's failure: the launcher
// exits with code, having said why.
type jobFailed struct {
	code int
	why  string
}

func (j *jobFailed) Error() string { return j.why }

// A worker is one process of the job.
type worker struct {
	rank   int
	cmd    *exec.Cmd
	out    []*rankWriter // flushed once the process exited
	joined bool
	exited bool
}

func (o *launchOptions) run(ctx context.Context, e *env) error {
	switch {
	case len(e.args) == 0:
		return usagef("give the program to start after --: vlink launch -n N -- PROGRAM [ARGS...]")
	case o.n < 1 || o.n > launch.MaxSize:
		return usagef("-n %d: want 1 to %d workers", o.n, launch.MaxSize)
	case o.joinTimeout < 0 || o.grace < 0:
		return usagef("--join-timeout and --grace want durations of 0 or more")
	}
	if err := checkHostPort(o.listen); err != nil {
		return usagef("--relay-listen %v", err)
	}
	path, err := exec.LookPath(e.args[0])
	if err != nil {
		return fmt.Errorf("cannot run %s: %w", e.args[0], err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	relay, err := control.NewRelay(control.RelayConfig{MaxNodes: o.n, Logger: e.log})
	if err != nil {
		return err
	}
	l, err := control.Listen(ctx, o.listen, key)
	if err != nil {
		return err
	}
	go relay.Serve(l)
	defer relay.Close()
	dir, err := os.MkdirTemp("", "vlink-launch-") // mode 700
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	g := startGuard(e, o.grace)
	defer g.done() // once the job has ended
	g.remove(dir)
	var outMu sync.Mutex // one line at a time, whoever writes it
	width := len(strconv.Itoa(o.n - 1))
	workers := make([]*worker, o.n)
	results := make(chan *worker, o.n)
	for r := range workers {
		w := &worker{rank: r}
		workers[r] = w
		name := launch.RankName(r)
		keyFile := filepath.Join(dir, name+".key")
		if err := os.WriteFile(keyFile, vlink.NodeKey(key, name), 0o600); err != nil {
			return stopAll(workers[:r], err)
		}
		w.cmd = exec.Command(path, e.args[1:]...)
		w.cmd.Env = append(os.Environ(),
			launch.EnvRank+"="+strconv.Itoa(r), launch.EnvSize+"="+strconv.Itoa(o.n),
			launch.EnvNode+"="+name, launch.EnvRelay+"="+l.Addr().String(), launch.EnvNodeKeyFile+"="+keyFile)
		w.cmd.SysProcAttr = workerAttr()
		// A worker that leaves a process behind holding its output open
		// has still exited: Wait returns a moment after it (the guard
		// stops what it left once the job ends).
		w.cmd.WaitDelay = 200 * time.Millisecond
		w.cmd.Stdout, w.cmd.Stderr = e.stdout, e.stderr
		if o.routeOutput {
			prefix := fmt.Sprintf("[%*d] ", width, r)
			so, se := &rankWriter{w: e.stdout, mu: &outMu, prefix: prefix}, &rankWriter{w: e.stderr, mu: &outMu, prefix: prefix}
			w.cmd.Stdout, w.cmd.Stderr, w.out = so, se, []*rankWriter{so, se}
		}
		if err := w.cmd.Start(); err != nil {
			return stopAll(workers[:r], fmt.Errorf("starting rank %d: %w", r, err))
		}
		g.watch(w.cmd.Process.Pid)
		go func() {
			w.cmd.Wait() // waits for the output to be copied too
			for _, o := range w.out {
				o.flush()
			}
			results <- w
		}()
	}
	start := time.Now()
	e.log.Info("launched", "workers", o.n, "program", e.args[0], "relay", l.Addr().String())

	var (
		failed    *jobFailed
		stopping  bool // SIGTERM sent
		killAt    <-chan time.Time
		joinLimit <-chan time.Time
		allJoined bool
	)
	if o.joinTimeout > 0 {
		t := time.NewTimer(o.joinTimeout)
		defer t.Stop()
		joinLimit = t.C
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	stop := func(why string) {
		if stopping {
			return
		}
		stopping = true
		e.log.Info("stopping the job", "why", why, "grace", o.grace)
		for _, w := range workers {
			if !w.exited {
				signalWorker(w.cmd.Process, syscall.SIGTERM)
			}
		}
		killAt = time.After(o.grace)
	}
	done := ctx.Done()
	for running := o.n; running > 0; {
		select {
		case w := <-results:
			running--
			w.exited = true
			st := w.cmd.ProcessState
			if st.Success() || failed != nil {
				continue // a job fails once: with its first failure
			}
			failed = &jobFailed{code: workerStatus(st), why: fmt.Sprintf("rank %d %s", w.rank, describeExit(st))}
			if stopping { // SIGINT or SIGTERM reached vlink launch
				failed.why += ", stopped by vlink launch"
			}
			stop(failed.why)
		case <-tick.C:
			if allJoined {
				continue
			}
			joinedNow := map[string]bool{}
			for _, n := range relay.Nodes() {
				joinedNow[n.Name] = true
			}
			allJoined = true
			for _, w := range workers {
				w.joined = w.joined || joinedNow[launch.RankName(w.rank)]
				allJoined = allJoined && (w.joined || w.exited)
			}
			if allJoined {
				e.log.Info("every worker joined, or exited", "took", time.Since(start).Round(time.Millisecond))
			}
		case <-joinLimit:
			var missing []string
			for _, w := range workers {
				if !w.joined && !w.exited {
					missing = append(missing, strconv.Itoa(w.rank))
				}
			}
			if len(missing) > 0 && failed == nil {
				failed = &jobFailed{code: exitFailure, why: fmt.Sprintf("rank %s did not join the job's network within %v (joining: launch.Join, or vlink exec --node \"$VLINK_NODE\" ...)",
					strings.Join(missing, ", rank "), o.joinTimeout)}
				stop(failed.why)
			}
		case <-done:
			done = nil
			stop("vlink launch was asked to stop")
		case <-killAt:
			killAt = nil
			for _, w := range workers {
				if !w.exited {
					e.log.Warn("killing a worker still running after the grace period", "rank", w.rank)
					signalWorker(w.cmd.Process, syscall.SIGKILL)
				}
			}
		}
	}
	if failed != nil {
		return failed
	}
	return nil
}

// stopAll kills the workers started so far, for a launch that could not
// start them all, and returns err.
func stopAll(started []*worker, err error) error {
	for _, w := range started {
		signalWorker(w.cmd.Process, syscall.SIGKILL)
	}
	return err
}

// workerStatus is the status a shell gives a process that ended as st
// did, never 0 for a failure.
func workerStatus(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if c := st.ExitCode(); c > 0 {
		return c
	}
	return exitFailure
}

func describeExit(st *os.ProcessState) string {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "was killed by signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exited with status %d", st.ExitCode())
}

// rankWriter writes a worker's output to w a line at a time, each after
// the worker's rank. A line longer than maxLine goes out in pieces, so a
// worker that never writes a newline holds bounded memory.
type rankWriter struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	line   []byte // the start of a line not yet written
}

const maxLine = 64 << 10

func (r *rankWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.line = append(r.line, p...)
			if len(r.line) >= maxLine {
				r.emit(r.line)
				r.line = r.line[:0]
			}
			break
		}
		r.emit(append(r.line, p[:i]...))
		r.line = r.line[:0]
		p = p[i+1:]
	}
	return n, nil
}

// flush writes the last line, if it had no newline.
func (r *rankWriter) flush() {
	if len(r.line) > 0 {
		r.emit(r.line)
		r.line = nil
	}
}

func (r *rankWriter) emit(line []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	buf := make([]byte, 0, len(r.prefix)+len(line)+1)
	buf = append(append(append(buf, r.prefix...), line...), '\n')
	r.w.Write(buf)
}

// A guard is a process of its own that stops what is left of the
// workers' process groups once vlink launch is gone, whichever way it
// went: the kernel's parent-death signal reaches a worker should vlink
// launch be killed, but not what the worker started, and a worker may
// leave a process behind when it exits. It reads the groups on its
// standard input, and at the end of its input (vlink launch closed it,
// or died) signals every group still there: SIGTERM, then SIGKILL after
// the grace period. It also removes the job's key files, which vlink
// launch removes itself unless it was killed.
type guard struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

// startGuard starts the guard; without one (no executable to run), it
// warns and returns a guard that does nothing.
func startGuard(e *env, grace time.Duration) *guard {
	self, err := os.Executable()
	if err == nil {
		cmd := exec.Command(self, "launch", "--guard", "--grace", grace.String())
		cmd.SysProcAttr = guardAttr()
		var in io.WriteCloser
		if in, err = cmd.StdinPipe(); err == nil {
			if err = cmd.Start(); err == nil {
				return &guard{cmd: cmd, in: in}
			}
		}
	}
	e.log.Warn("no guard for the workers: should vlink launch be killed, what they started may outlive it", "err", err)
	return &guard{}
}

// watch has the guard stop process group pgid.
func (g *guard) watch(pgid int) {
	if g.in != nil {
		fmt.Fprintf(g.in, "%d\n", pgid)
	}
}

// remove has the guard remove dir, the job's key files, should vlink
// launch die before removing it.
func (g *guard) remove(dir string) {
	if g.in != nil {
		fmt.Fprintf(g.in, "rm %s\n", dir)
	}
}

// done lets the guard clean up: vlink launch does not wait for it.
func (g *guard) done() {
	if g.in != nil {
		g.in.Close()
		go g.cmd.Wait()
	}
}

// runGuard is the guard's side (vlink launch --guard).
func runGuard(in io.Reader, grace time.Duration) {
	var pgids []int
	var dirs []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		if dir, ok := strings.CutPrefix(line, "rm "); ok {
			// Only what startGuard's caller made: a vlink-launch- folder
			// of the temporary directory.
			if filepath.Dir(dir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(dir), "vlink-launch-") {
				dirs = append(dirs, dir)
			}
			continue
		}
		if pgid, err := strconv.Atoi(line); err == nil && pgid > 1 {
			pgids = append(pgids, pgid)
		}
	}
	for _, d := range dirs {
		os.RemoveAll(d)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		alive := false
		for _, pgid := range pgids {
			alive = signalGroup(pgid, sig) || alive
		}
		if !alive {
			return
		}
		time.Sleep(grace)
	}
}

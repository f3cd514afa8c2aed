// Package launcher is "vlink launch": it starts a job of N worker
// processes (locally, over SSH, or through a command such as srun),
// runs the job's relay, relays each worker's output after its rank, and
// ends the job when a worker fails. It is also the remote agent a
// worker's machine runs (vlink launch --worker) and the guard that
// kills a job's processes should vlink die (--guard). A worker's side
// is the library's: package vlink/launch.
package launcher

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/jobwire"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/launch"
)

var Cmd = &cli.Command{
	Name:     "launch",
	Summary:  "start a job of N processes that reach each other by rank over a vlink network",
	Synopsis: "--n N [flags] -- PROGRAM [ARGS...]",
	About: `
Starts N processes of PROGRAM, a job, and runs the job's vlink network:
a relay made for the job, with a key of its own that only the job's
processes hold. Each process, a worker, finds in its environment:

  VLINK_RANK           its rank, 0 to N-1
  VLINK_SIZE           N
  VLINK_NODE           its node name in the job's network: rankR
  VLINK_RELAY          the job's relay, HOST:PORT
  VLINK_NODE_KEY_FILE  its node key, in a file only the user reads,
                       removed when the job ends
  VLINK_JOB            the job's id, by which its ranks on one host find
                       each other

A Go program joins with launch.Join (package vlink/launch), which dials
rank R's port P, accepts the other ranks' connections, and waits for
them all at a barrier. Its ranks on one host talk over shared memory
(rings in memory both processes map, as pscom within a node), the
others through the job's network, encrypted; --shm=false (or -x
VLINK_SHM=off) keeps every rank on the network. Unmodified programs
use the node flags of vlink's commands with these variables: under
vlink exec --node "$VLINK_NODE" --relay "$VLINK_RELAY" --node-key-file
"$VLINK_NODE_KEY_FILE", a program reaches rank R's port P as
rankR.vlink.alt:P, which vlink serve, given the same flags and --allow
localhost:P, exposes on rank R.

Spawners (--spawner, as udp-conduit's GASNET_SPAWNFN L, S and C):

  local   every worker on this machine (the default)
  ssh     rank R on server R modulo their number (--ssh-servers), with
          the ssh layer's configuration: ~/.ssh/config, the agent,
          known_hosts (--ssh-options takes the layer's parameters). One
          SSH connection per server carries the workers' sessions and
          the job's relay, forwarded to the server's loopback, so the
          servers need to let in nothing but SSH. The servers run the
          same vlink (--worker-vlink: its path there) in --remote-dir.
  custom  runs --custom once with sh -c, which must start N workers each
          running %C (srun -n %N %C, mpirun -np %N %C, a script): %N is
          N, %C the worker's command, %D this folder, %P the program,
          %M the first N --custom-servers, %% a %. Each %C connects back
          to vlink launch at the relay's host, proving the job's secret
          from $VLINK_LAUNCH_SECRET, which the command must pass on to
          the workers (srun and mpiexec do; Open MPI's mpirun needs -x
          VLINK_LAUNCH_SECRET), and is given the next rank.

udp-conduit's variables work too, with their GASNET_ or AMUDP_ prefix or
without: SSH_SERVERS, SSH_REMOTE_PATH, CSPAWN_CMD, CSPAWN_SERVERS and
CSPAWN_ROUTE_OUTPUT.

Each worker's output goes to vlink's, line by line, after its rank in
brackets ("[3] ..."; --route-output=false passes it through as it is;
the custom spawner's default is false, as udp-conduit's). The job
succeeds when every worker exits 0. Otherwise vlink launch stops the
others (SIGTERM, then SIGKILL after --grace), says which rank failed and
how, then how every rank ended, and exits with that worker's status
(128+N for a signal N). A
worker still running after --join-timeout without having joined fails
the job, and the message names the missing ranks. A worker that exits
without joining does not. A job that runs past --time is stopped the
same way, and vlink launch exits with status 124. SIGINT reaches every
worker as SIGINT, SIGTERM as SIGTERM; a second one kills them at once
(SIGKILL).

Nothing outlives the job: what a worker leaves running is stopped when
the job ends, even a process that left its process group (setsid, a
daemon): the job's processes run in a cgroup of their own where vlink
launch may make one (cgroup v2), else vlink launch is their subreaper
(--log-level info says which). If vlink launch itself is killed, the
kernel kills the local workers, and a guard process stops what they
started (all of the cgroup; only their process groups without one) and
removes the job's key files; a remote worker's agent stops the worker,
and what it started, when its SSH session or its connection to vlink
launch ends (an SSH connection that drops fails the job), and a guard of
its own does if the agent is killed.

vlink launch's standard input goes to rank 0, as under mpirun (--stdin
names another rank, all, or none); the other workers' input is empty.
`,
	Examples: `
  # Four workers, each saying where it is in the job:
  vlink launch --n 4 -- sh -c 'echo "rank $VLINK_RANK of $VLINK_SIZE is $VLINK_NODE"'

  # Eight workers of a Go program that calls launch.Join:
  vlink launch --n 8 -- ./allreduce

  # Over SSH, on two servers that have this vlink at the same path:
  vlink launch --n 4 --ssh-servers 'node1 node2' -- ./allreduce

  # In a Slurm batch script (sbatch -n 64 job.sh): one srun step of
  # SLURM_NTASKS workers, rank R on Slurm's task R:
  vlink launch -- ./allreduce
`,
	Args: true,
	// The workers' output is the output: vlink launch adds warnings and
	// errors only, unless told otherwise.
	Flags: base.WithEnvAt(slog.LevelWarn, "", launchFlags),
	// SIGINT reaches the workers as SIGINT, SIGTERM as SIGTERM, and a
	// second one kills them at once, as under mpirun and srun.
	OwnSignals: true,
}

type launchOptions struct {
	n                   int
	nSet                bool // --n was given: 0 is then out of range rather than missing
	listenSet           bool // --relay-listen was given: the workers may reach the relay there
	joinTimeout, grace  time.Duration
	timeLimit           time.Duration
	outputDir           string
	export              []string // -x: NAME=VALUE for every worker
	stdin               string   // --stdin: 0, a rank, all or none
	tagHost, timestamps bool
	listen              string
	routeOutput         bool
	shm                 bool
	spawner             string
	sshServers          string
	hostfile            string
	sshOptions          string
	remoteDir           string
	workerVLink         string
	custom              string
	customServers       string
	guard               bool
	worker              string
	signals             <-chan os.Signal // SIGINT and SIGTERM to vlink launch; nil in tests that cancel the context
}

func launchFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &launchOptions{}
	fs.IntVar(&o.n, "n", 0, fmt.Sprintf("start `N` workers, 1 to %d (required)", launch.MaxSize))
	fs.StringVar(&o.spawner, "spawner", "", "start the workers with `SPAWNER`: local (on this machine), ssh (on the --ssh-servers), custom (with the --custom command) or slurm (one srun step in the Slurm allocation vlink launch runs in: --n defaults to its SLURM_NTASKS, and rank R is Slurm's task R); default: custom with --custom, ssh with --ssh-servers or --hostfile, $VLINK_SPAWNER, $GASNET_SPAWNFN's L, S or C, slurm inside an allocation (SLURM_JOB_ID), else local")
	fs.StringVar(&o.sshServers, "ssh-servers", "", "the ssh spawner's `SERVERS`, [user@]host[:port] separated by spaces or commas, ranges as Slurm writes them (node[1-4,7]); a server named twice runs two workers: rank R runs on server R modulo their number; $VLINK_SSH_SERVERS, $GASNET_SSH_SERVERS, $SSH_SERVERS")
	fs.StringVar(&o.hostfile, "hostfile", "", "the ssh spawner's servers from `FILE`, as mpirun's: a host per line (ranges allowed), \"slots=N\" for how many workers it runs before the next host gets one, # comments; $VLINK_HOSTFILE")
	fs.StringVar(&o.sshOptions, "ssh-options", "", "the ssh layer's `PARAMS` for every server, as in a stack: identity=FILE,known-hosts=FILE,host-key-check=accept-new,... (vlink layers ssh); $VLINK_SSH_OPTIONS")
	fs.StringVar(&o.remoteDir, "remote-dir", "", "the ssh spawner runs the workers in `DIR` on the servers (default: this folder); $VLINK_REMOTE_DIR, $SSH_REMOTE_PATH")
	fs.StringVar(&o.workerVLink, "worker-vlink", "", "the vlink executable the ssh and custom spawners run on the servers, at `PATH` there (default: this one's path)")
	fs.StringVar(&o.custom, "custom", "", "the custom spawner's `COMMAND`, run once by sh -c to start N workers that each run %C: %N is N, %C the worker's command, %D this folder, %P the program, %M the first N --custom-servers, %% a %; $VLINK_CSPAWN_CMD, $GASNET_CSPAWN_CMD, $CSPAWN_CMD")
	fs.StringVar(&o.customServers, "custom-servers", "", "the `SERVERS` %M lists, separated by spaces; $VLINK_CSPAWN_SERVERS, $CSPAWN_SERVERS")
	fs.DurationVar(&o.joinTimeout, "join-timeout", time.Minute, "fail the job when a worker has run for `DURATION` without joining its network (a program that never joins, as under pdsh: 0); 0: never")
	fs.Func("x", "give every worker, remote ones too, the environment variable `NAME` with its value here, or NAME=VALUE (repeatable), as mpirun -x", func(v string) error {
		kv, err := exportEntry(v)
		if err == nil {
			o.export = append(o.export, kv)
		}
		return err
	})
	fs.BoolVar(&o.tagHost, "tag-host", false, "name the host in each line's tag: [R@HOST], as mpirun --tag-output")
	fs.BoolVar(&o.timestamps, "timestamps", false, "put the time each line came (local, to the millisecond) after its tag, as mpirun --timestamp-output")
	fs.StringVar(&o.stdin, "stdin", "0", "give vlink launch's standard input to rank `WHICH`: a rank (0, as mpirun), all (every rank, as srun --input=all) or none (their input is empty)")
	fs.StringVar(&o.outputDir, "output-dir", "", "write each rank's standard output and error to `DIR`/rankR.out and DIR/rankR.err (DIR made if missing) instead of vlink's, as mpirun --output-filename")
	fs.DurationVar(&o.timeLimit, "time", 0, "end the job after `DURATION`, as srun --time: its workers get SIGTERM, then SIGKILL after --grace, and vlink launch exits with status 124, as timeout(1); 0: no limit")
	fs.DurationVar(&o.grace, "grace", 5*time.Second, "when the job ends early (a worker failed, SIGINT or SIGTERM), give the other workers `DURATION` after that signal (SIGTERM when a worker failed) before SIGKILL")
	fs.StringVar(&o.listen, "relay-listen", defaultRelayListen, "run the job's relay on `ADDR` (host:port); the custom and slurm spawners' workers must reach it (and a port beside it), and once given, the ssh spawner's workers reach it there when a server's sshd refuses TCP forwarding; under Slurm on several nodes, every address")
	fs.BoolVar(&o.shm, "shm", true, "ranks of one host that joined with launch.Join talk over shared memory; false: through the job's network (TCP, encrypted), as between hosts")
	fs.BoolVar(&o.routeOutput, "route-output", true, "prefix each line the workers write with their rank; false: their output passes through unchanged (the custom spawner routes it only when given this flag, or $CSPAWN_ROUTE_OUTPUT=1)")
	fs.BoolVar(&o.guard, "guard", false, "(internal) be the guard of a launch: see runGuard")
	fs.StringVar(&o.worker, "worker", "", "(internal) be the agent of a remote worker, talking to vlink launch at `ADDR`, or on standard input and output for -: see runWorker")
	return func(ctx context.Context, e *base.Env) int {
		if o.guard {
			// It ends when its input does: that is when it must clean up.
			signal.Ignore(os.Interrupt, syscall.SIGTERM)
			runGuard(e.Stdin, o.grace)
			return base.ExitOK
		}
		if o.worker != "" {
			// vlink launch's signals come as frames; its own stop it.
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runWorker(ctx, e, o)
		}
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sigs)
		o.signals = sigs
		routeSet := false
		fs.Visit(func(f *flag.Flag) {
			routeSet = routeSet || f.Name == "route-output"
			o.nSet = o.nSet || f.Name == "n"
			o.listenSet = o.listenSet || f.Name == "relay-listen"
		})
		err := o.run(ctx, e, routeSet)
		var jf *jobFailed
		if errors.As(err, &jf) {
			fmt.Fprintf(e.Stderr, "vlink launch: %s\n", jf.why)
			if jf.summary != "" {
				fmt.Fprintf(e.Stderr, "vlink launch: every rank: %s\n", jf.summary)
			}
			return jf.code
		}
		if err != nil {
			return base.Fail(e, "vlink launch", err)
		}
		return base.ExitOK
	}
}

// defaultRelayListen is where the job's relay listens unless told: on
// loopback, for the local spawner's workers and ssh's forwarded ports.
const defaultRelayListen = "127.0.0.1:0"

// exitTimeLimit is vlink launch's status when --time ended the job, as
// timeout(1)'s.
const exitTimeLimit = 124

// jobFailed is a job that ended with a worker's failure: the launcher
// exits with code, having said why.
type jobFailed struct {
	code    int
	why     string
	summary string // how each rank ended (summarize)
}

func (j *jobFailed) Error() string { return j.why }

// A worker is one process of the job, wherever it runs.
type worker struct {
	rank   int
	joined bool   // seen at the relay (the main loop's)
	exited bool   // its ending came (the main loop's)
	how    string // how it ended, once it did (the main loop's)

	mu      sync.Mutex
	signal  func(syscall.Signal) // nil until the worker runs
	pending syscall.Signal       // asked for before it ran
}

// setSignal gives w the way to signal it, and delivers a signal asked
// for before.
func (w *worker) setSignal(f func(syscall.Signal)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.signal = f
	if w.pending != 0 {
		f(w.pending)
	}
}

// started reports whether the worker runs, or ran.
func (w *worker) started() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.signal != nil
}

func (w *worker) kill(sig syscall.Signal) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.signal == nil {
		w.pending = sig
		return
	}
	w.signal(sig)
}

// An ending is how a worker, or a spawner (w nil), ended: code 0 is
// success, and why says how in words after "rank R".
type ending struct {
	w    *worker
	code int
	why  string
}

// A job is what the spawners share with vlink launch's main loop.
type job struct {
	o       *launchOptions
	e       *base.Env
	path    string // the program, as found on this machine
	key     []byte // the job's network key
	relay   *control.Relay
	relayL  net.Listener
	dir     string // the job's key files on this machine
	guard   *guard
	jail    *jail         // the local workers' (nil: none)
	hurry   bool          // a second signal: what is left goes without grace
	files   [][2]*os.File // with --output-dir: each rank's output and error
	stdin   *stdinFeed
	workers []*worker
	ended   chan ending // one per worker, and one per spawner that fails
	route   bool

	outMu sync.Mutex // one line at a time, whoever writes it
	width int
}

// outputs returns where rank r's standard output and error go, and
// the writers to flush once it ended. host is where it runs, for
// --tag-host.
func (j *job) outputs(r int, host string) (stdout, stderr io.Writer, flush func()) {
	if j.files != nil {
		return j.files[r][0], j.files[r][1], func() {}
	}
	if !j.route {
		return j.e.Stdout, j.e.Stderr, func() {}
	}
	prefix := fmt.Sprintf("[%*d] ", j.width, r)
	if j.o.tagHost {
		prefix = fmt.Sprintf("[%*d@%s] ", j.width, r, host)
	}
	so := &rankWriter{w: j.e.Stdout, mu: &j.outMu, prefix: prefix, stamp: j.o.timestamps}
	se := &rankWriter{w: j.e.Stderr, mu: &j.outMu, prefix: prefix, stamp: j.o.timestamps}
	return so, se, func() { so.flush(); se.flush() }
}

// openOutputs makes dir and each rank's files in it (--output-dir).
func openOutputs(dir string, n int) ([][2]*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--output-dir: %w", err)
	}
	files := make([][2]*os.File, n)
	for r := range files {
		for i, ext := range []string{".out", ".err"} {
			f, err := os.Create(filepath.Join(dir, launch.RankName(r)+ext))
			if err != nil {
				for _, g := range files[:r+1] {
					g[0].Close() // a nil *os.File returns ErrInvalid
					g[1].Close()
				}
				return nil, fmt.Errorf("--output-dir: %w", err)
			}
			files[r][i] = f
		}
	}
	return files, nil
}

// A spawner starts the job's workers.
type spawner interface {
	// start starts every worker; each sends its ending on j.ended. An
	// error means none runs.
	start(ctx context.Context, j *job) error
	// stop is called when the job stops early, after the workers were
	// signalled: the spawner ends what it started that is no worker.
	stop()
	// wait returns once the spawner's own processes are gone, after the
	// workers ended.
	wait()
}

func (o *launchOptions) run(ctx context.Context, e *base.Env, routeSet bool) error {
	if err := o.slurmDefaults(e); err != nil {
		return err
	}
	// Every worker's, remote ones too, as -x's.
	o.export = append(o.export, launch.EnvJob+"="+newJobID())
	if !o.shm {
		o.export = append(o.export, vlink.EnvShm+"="+string(vlink.ShmOff))
	}
	switch {
	case len(e.Args) == 0:
		return base.Usagef("give the program to start after --: vlink launch --n N -- PROGRAM [ARGS...]")
	case !o.nSet:
		return base.Usagef("--n N is required: how many workers to start, 1 to %d", launch.MaxSize)
	case o.n < 1 || o.n > launch.MaxSize:
		return base.Usagef("--n %d: want 1 to %d workers", o.n, launch.MaxSize)
	case exportSize(o.export) > jobwire.MaxEnv:
		return base.Usagef("-x: the variables add up to %d bytes, at most %d", exportSize(o.export), jobwire.MaxEnv)
	case o.joinTimeout < 0 || o.grace < 0 || o.timeLimit < 0:
		return base.Usagef("--join-timeout, --grace and --time want durations of 0 or more")
	}
	if err := base.CheckHostPort(o.listen); err != nil {
		return base.Usagef("--relay-listen %v", err)
	}
	sp, route, err := o.pickSpawner(e, routeSet)
	if err != nil {
		return err
	}
	j := &job{o: o, e: e, route: route, width: len(strconv.Itoa(o.n - 1)), ended: make(chan ending, 2*o.n+2)}
	if j.stdin, err = newStdinFeed(o.stdin, o.n, e.Stdin); err != nil {
		return base.Usagef("%v", err)
	}
	if _, local := sp.(localSpawner); local {
		if j.path, err = exec.LookPath(e.Args[0]); err != nil {
			return fmt.Errorf("cannot run %s: %w", e.Args[0], err)
		}
	}
	j.key = make([]byte, 32)
	rand.Read(j.key)
	if j.relay, err = control.NewRelay(control.RelayConfig{MaxNodes: o.n, Logger: e.Log}); err != nil {
		return err
	}
	defer j.relay.Close()
	if j.relayL, err = j.relay.Listen(ctx, o.listen, j.key); err != nil {
		return err
	}
	go j.relay.Serve(j.relayL)
	if j.dir, err = os.MkdirTemp("", "vlink-launch-"); err != nil { // mode 700
		return err
	}
	defer os.RemoveAll(j.dir)
	if o.outputDir != "" {
		if j.files, err = openOutputs(o.outputDir, o.n); err != nil {
			return err
		}
		defer func() {
			for _, f := range j.files {
				f[0].Close()
				f[1].Close()
			}
		}()
	}
	j.guard = startGuard(e, o.grace)
	defer j.guard.done() // once the job has ended
	j.guard.remove(j.dir)
	if _, local := sp.(localSpawner); local {
		j.jail = holdJob(e, j.guard)
		defer func() { // after the spawner's wait, before the guard's end
			grace := o.grace
			if j.hurry {
				grace = 0
			}
			j.jail.stop(grace)
		}()
	}
	j.workers = make([]*worker, o.n)
	for r := range j.workers {
		j.workers[r] = &worker{rank: r}
	}
	if err := sp.start(ctx, j); err != nil {
		for _, w := range j.workers {
			w.kill(syscall.SIGKILL)
		}
		sp.stop()
		return err
	}
	defer sp.wait()
	return j.loop(ctx, sp)
}

// loop waits for the workers to end, stopping the job when one fails,
// when one does not join in time, or when vlink launch is asked to.
func (j *job) loop(ctx context.Context, sp spawner) error {
	o, e := j.o, j.e
	start := time.Now()
	e.Log.Info("launched", "workers", o.n, "program", e.Args[0], "relay", j.relayL.Addr().String())
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
	var timeUp <-chan time.Time
	if o.timeLimit > 0 {
		t := time.NewTimer(o.timeLimit)
		defer t.Stop()
		timeUp = t.C
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	stop := func(why string, sig syscall.Signal) {
		if stopping {
			return
		}
		stopping = true
		e.Log.Info("stopping the job", "why", why, "signal", sig, "grace", o.grace)
		for _, w := range j.workers {
			if !w.exited {
				w.kill(sig)
			}
		}
		sp.stop()
		killAt = time.After(o.grace)
	}
	done := ctx.Done()
	for running := o.n; running > 0; {
		select {
		case end := <-j.ended:
			if end.w != nil {
				running--
				end.w.exited, end.w.how = true, end.why
				if end.code == 0 {
					end.w.how = "exited with status 0"
				}
			}
			if end.code == 0 || failed != nil {
				continue // a job fails once: with its first failure
			}
			failed = &jobFailed{code: end.code, why: end.why}
			if end.w != nil {
				failed.why = fmt.Sprintf("rank %d %s", end.w.rank, end.why)
			}
			if stopping { // SIGINT or SIGTERM reached vlink launch
				failed.why += ", stopped by vlink launch"
			}
			stop(failed.why, syscall.SIGTERM)
		case <-tick.C:
			if allJoined {
				continue
			}
			joinedNow := map[string]bool{}
			for _, n := range j.relay.Nodes() {
				joinedNow[n.Name] = true
			}
			allJoined = true
			for _, w := range j.workers {
				w.joined = w.joined || joinedNow[launch.RankName(w.rank)]
				allJoined = allJoined && (w.joined || w.exited)
			}
			if allJoined {
				e.Log.Info("every worker joined, or exited", "took", time.Since(start).Round(time.Millisecond))
			}
		case <-joinLimit:
			var missing, unstarted []string
			for _, w := range j.workers {
				switch {
				case w.joined || w.exited:
				case !w.started():
					unstarted = append(unstarted, strconv.Itoa(w.rank))
				default:
					missing = append(missing, strconv.Itoa(w.rank))
				}
			}
			var whys []string
			if len(missing) > 0 {
				whys = append(whys, fmt.Sprintf("rank %s did not join the job's network within %v (joining: launch.Join, or vlink exec --node \"$VLINK_NODE\" ...; for a program that never joins: --join-timeout 0)",
					strings.Join(missing, ", rank "), o.joinTimeout))
			}
			if len(unstarted) > 0 {
				whys = append(whys, fmt.Sprintf("rank %s never started within %v (the spawner started %d of %d workers)",
					strings.Join(unstarted, ", rank "), o.joinTimeout, o.n-len(unstarted), o.n))
			}
			if len(whys) > 0 && failed == nil {
				failed = &jobFailed{code: base.ExitFailure, why: strings.Join(whys, "; ")}
				stop(failed.why, syscall.SIGTERM)
			}
		case <-timeUp:
			if failed == nil {
				failed = &jobFailed{code: exitTimeLimit, why: fmt.Sprintf("the job ran out of its time (--time %v)", o.timeLimit)}
				stop(failed.why, syscall.SIGTERM)
			}
		case <-done:
			done = nil
			stop("vlink launch was asked to stop", syscall.SIGTERM)
		case sig := <-o.signals:
			if !stopping {
				// The workers get what vlink launch got: a program's
				// handler for Ctrl-C is for SIGINT.
				stop("vlink launch got "+sig.String(), sig.(syscall.Signal))
				continue
			}
			// A second one: the user does not want to wait.
			killAt, j.hurry = nil, true
			e.Log.Warn("a second signal: killing the workers now", "signal", sig)
			for _, w := range j.workers {
				if !w.exited {
					w.kill(syscall.SIGKILL)
				}
			}
		case <-killAt:
			killAt = nil
			for _, w := range j.workers {
				if !w.exited {
					e.Log.Warn("killing a worker still running after the grace period", "rank", w.rank)
					w.kill(syscall.SIGKILL)
				}
			}
		}
	}
	if failed != nil {
		if o.n > 1 {
			failed.summary = summarize(j.workers)
		}
		return failed
	}
	return nil
}

// summarize says how each worker ended, ranks that ended alike together:
// "ranks 0-3, 5: exited with status 0; rank 4: killed by signal
// terminated".
func summarize(workers []*worker) string {
	var hows []string
	ranks := map[string][]int{}
	for _, w := range workers {
		how := strings.TrimPrefix(w.how, "was ")
		if how == "" {
			how = "no end reported"
		}
		if _, seen := ranks[how]; !seen {
			hows = append(hows, how)
		}
		ranks[how] = append(ranks[how], w.rank)
	}
	parts := make([]string, len(hows))
	for i, how := range hows {
		rs := ranks[how]
		word := "rank "
		if len(rs) > 1 {
			word = "ranks "
		}
		parts[i] = word + rankRanges(rs) + ": " + how
	}
	return strings.Join(parts, "; ")
}

// rankRanges writes sorted ranks as ranges: "0-3, 5, 7-8".
func rankRanges(rs []int) string {
	var b strings.Builder
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", rs[i], rs[j])
		} else {
			fmt.Fprintf(&b, "%d", rs[i])
		}
		i = j + 1
	}
	return b.String()
}

// localSpawner starts every worker on this machine.
type localSpawner struct{}

func (localSpawner) start(ctx context.Context, j *job) error {
	e := j.e
	host, _ := os.Hostname()
	for r, w := range j.workers {
		name := launch.RankName(r)
		keyFile := filepath.Join(j.dir, name+".key")
		if err := os.WriteFile(keyFile, vlink.NodeKey(j.key, name), 0o600); err != nil {
			return err
		}
		cmd := exec.Command(j.path, e.Args[1:]...)
		cmd.Env = slices.Concat(os.Environ(), j.o.export, workerEnv(r, j.o.n, j.relayL.Addr().String(), keyFile))
		cmd.SysProcAttr = workerAttr()
		// A worker that leaves a process behind holding its output open
		// has still exited: Wait returns a moment after it (the guard
		// stops what it left once the job ends).
		cmd.WaitDelay = 200 * time.Millisecond
		var flush func()
		cmd.Stdout, cmd.Stderr, flush = j.outputs(r, host)
		var stdin io.WriteCloser
		if f := j.stdin.direct(r); f != nil {
			cmd.Stdin = f
		} else if j.stdin.wants(r) {
			var err error
			if stdin, err = cmd.StdinPipe(); err != nil {
				return err
			}
		}
		if err := j.jail.start(cmd); err != nil {
			return fmt.Errorf("starting rank %d: %w", r, err)
		}
		if stdin != nil {
			j.stdin.subscribe(func(p []byte) error { _, err := stdin.Write(p); return err }, func() { stdin.Close() })
		}
		j.guard.watch(cmd.Process.Pid)
		w.setSignal(func(sig syscall.Signal) { signalWorker(cmd.Process, sig) })
		go func() {
			cmd.Wait() // waits for the output to be copied too
			cleanUp(cmd.Env, r)
			flush()
			st := cmd.ProcessState
			if st.Success() {
				j.ended <- ending{w: w}
				return
			}
			j.ended <- ending{w: w, code: workerStatus(st), why: describeExit(st)}
		}()
	}
	return nil
}

func (localSpawner) stop() {}
func (localSpawner) wait() {}

// workerEnv is the environment that tells a worker its place in the job.
func exportSize(env []string) (n int) {
	for _, kv := range env {
		n += len(kv)
	}
	return n
}

// exportEntry makes -x's value a NAME=VALUE entry: NAME alone takes its
// value here. The variables vlink launch sets for each worker are not
// for the user to set.
func exportEntry(v string) (string, error) {
	name, value, hasValue := strings.Cut(v, "=")
	switch {
	case name == "" || strings.ContainsRune(v, 0):
		return "", fmt.Errorf("%q: want NAME or NAME=VALUE", v)
	case slices.Contains([]string{launch.EnvRank, launch.EnvSize, launch.EnvNode, launch.EnvRelay, launch.EnvNodeKeyFile, launch.EnvJob}, name):
		return "", fmt.Errorf("%s: vlink launch sets it for each worker", name)
	case !hasValue:
		if value, hasValue = os.LookupEnv(name); !hasValue {
			return "", fmt.Errorf("%s is not set here: give -x %s=VALUE", name, name)
		}
	}
	return name + "=" + value, nil
}

// cleanUp removes what rank r, started with env, may have left for the
// ranks of its host to find it (launch.CleanUp), now that it ended.
func cleanUp(env []string, r int) {
	for _, kv := range slices.Backward(env) {
		if id, ok := strings.CutPrefix(kv, launch.EnvJob+"="); ok {
			launch.CleanUp(id, r)
			return
		}
	}
}

// newJobID returns a job's id, as launch.Join takes it: 32 hexadecimal
// digits, random, so no two jobs of a host share one.
func newJobID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func workerEnv(rank, size int, relay, keyFile string) []string {
	return []string{
		launch.EnvRank + "=" + strconv.Itoa(rank), launch.EnvSize + "=" + strconv.Itoa(size),
		launch.EnvNode + "=" + launch.RankName(rank), launch.EnvRelay + "=" + relay, launch.EnvNodeKeyFile + "=" + keyFile,
	}
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
	return base.ExitFailure
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
	stamp  bool   // each line after the time it came, as --timestamps asks
	line   []byte // the start of a line not yet written
}

const maxLine = 64 << 10

// stampLayout is --timestamps' time of a line, local, to the millisecond.
const stampLayout = "15:04:05.000"

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
	buf := make([]byte, 0, len(r.prefix)+len(stampLayout)+1+len(line)+1)
	buf = append(buf, r.prefix...)
	if r.stamp {
		buf = append(time.Now().AppendFormat(buf, stampLayout), ' ')
	}
	buf = append(append(buf, line...), '\n')
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
func startGuard(e *base.Env, grace time.Duration) *guard {
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
	e.Log.Warn("no guard for the workers: should vlink launch be killed, what they started may outlive it", "err", err)
	return &guard{}
}

// watch has the guard stop process group pgid.
func (g *guard) watch(pgid int) {
	if g.in != nil {
		fmt.Fprintf(g.in, "%d\n", pgid)
	}
}

// cgroup has the guard end what is left in a job's cgroup, and remove
// it, should vlink launch die first.
func (g *guard) cgroup(dir string) {
	if g.in != nil {
		fmt.Fprintf(g.in, "cg %s\n", dir)
	}
}

// pid returns the guard's process id, 0 if there is none.
func (g *guard) pid() int {
	if g.cmd == nil {
		return 0
	}
	return g.cmd.Process.Pid
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
	var dirs, cgroups []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		if dir, ok := strings.CutPrefix(line, "cg "); ok {
			cgroups = append(cgroups, dir)
			continue
		}
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
	for _, cg := range cgroups {
		endCgroup(cg, grace)
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

package launcher

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	sshf "github.com/vlink-dev/vlink/factories/ssh"
	"github.com/vlink-dev/vlink/internal/jobwire"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/launch"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// The remote spawners, ssh and custom, start on each worker's machine
// an agent, vlink launch --worker, which receives the worker's rank and
// node key from vlink launch over a private stream (the SSH session's
// standard input and output, or a connection back to vlink launch
// encrypted and authenticated with the job's secret), runs the worker
// program, sends back its output and how it ended, passes on the
// signals vlink launch sends, and stops the worker and what it started
// when that stream ends: an ssh connection that drops, or a vlink
// launch that dies, leaves nothing running.

// envLaunchSecret holds, for the custom spawner's agents, the secret
// that proves they belong to the job; the agent removes it from the
// worker's environment.
const envLaunchSecret = "VLINK_LAUNCH_SECRET"

// agentHelloTimeout bounds how long a connection back to vlink launch
// may take to say hello, and an agent to be told its rank.
const agentHelloTimeout = 30 * time.Second

// firstEnv returns the first of the variables that is set.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// seedEnv returns $VLINK_name, else the udp-conduit spawner's variable
// of that name, with its GASNET_ or AMUDP_ prefix or without.
func seedEnv(vlinkName, seedName string) string {
	return firstEnv("VLINK_"+vlinkName, "GASNET_"+seedName, "AMUDP_"+seedName, seedName)
}

// splitHosts splits a list of servers at spaces, and at commas outside
// a range's brackets ("a,node[1-3,7]" is a and node[1-3,7]).
func splitHosts(list string) []string {
	depth := 0
	return strings.FieldsFunc(list, func(r rune) bool {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			return depth == 0
		case ' ', '\t', '\n':
			return true
		}
		return false
	})
}

// spawnerName returns the spawner the flags, then the environment,
// choose: inside a Slurm allocation (SLURM_JOB_ID), slurm unless told
// otherwise; else local.
func (o *launchOptions) spawnerName() string {
	switch {
	case o.spawner != "":
		return o.spawner
	case o.custom != "":
		return "custom"
	case o.sshServers != "" || o.hostfile != "":
		return "ssh"
	case os.Getenv("VLINK_SPAWNER") != "":
		return os.Getenv("VLINK_SPAWNER")
	}
	switch strings.ToUpper(firstEnv("GASNET_SPAWNFN", "AMUDP_SPAWNFN")) {
	case "S":
		return "ssh"
	case "C":
		return "custom"
	}
	if os.Getenv("SLURM_JOB_ID") != "" {
		return "slurm"
	}
	return "local"
}

// slurmDefaults takes what a Slurm allocation says when the slurm
// spawner runs: --n from SLURM_NTASKS unless given, and a relay the
// allocation's other nodes reach when it spans more than one (the
// default relay listens on loopback).
func (o *launchOptions) slurmDefaults(e *base.Env) error {
	if o.spawnerName() != "slurm" {
		return nil
	}
	if os.Getenv("SLURM_JOB_ID") == "" {
		return base.Usagef("the slurm spawner runs inside a Slurm allocation (sbatch, salloc): SLURM_JOB_ID is not set")
	}
	if !o.nSet {
		n, err := strconv.Atoi(os.Getenv("SLURM_NTASKS"))
		if err != nil {
			return base.Usagef("--n N is required: SLURM_NTASKS does not say how many tasks the allocation has (sbatch -n N)")
		}
		o.n, o.nSet = n, true
	}
	if nodes, _ := strconv.Atoi(os.Getenv("SLURM_JOB_NUM_NODES")); nodes > 1 && !o.listenSet {
		o.listen = "0.0.0.0:0" // reached at this node's name; the relay and the agents' listener take the job's keys only
		e.Log.Info("the allocation spans several nodes: the job's relay listens on every address", "nodes", nodes)
	}
	return nil
}

// slurmCommand is the slurm spawner's command: one srun step of N tasks
// in the allocation, each an agent, whose failures vlink launch handles
// itself (--kill-on-bad-exit=0).
const slurmCommand = "srun --ntasks=%N --kill-on-bad-exit=0 --export=ALL %C"

// pickSpawner chooses the spawner from the flags, then the environment,
// and says whether the workers' output is routed.
func (o *launchOptions) pickSpawner(e *base.Env, routeSet bool) (spawner, bool, error) {
	name := o.spawnerName()
	o.sshServers = cmp.Or(o.sshServers, seedEnv("SSH_SERVERS", "SSH_SERVERS"))
	o.sshOptions = cmp.Or(o.sshOptions, os.Getenv("VLINK_SSH_OPTIONS"))
	o.hostfile = cmp.Or(o.hostfile, os.Getenv("VLINK_HOSTFILE"))
	o.remoteDir = cmp.Or(o.remoteDir, seedEnv("REMOTE_DIR", "SSH_REMOTE_PATH"))
	o.custom = cmp.Or(o.custom, seedEnv("CSPAWN_CMD", "CSPAWN_CMD"))
	o.customServers = cmp.Or(o.customServers, seedEnv("CSPAWN_SERVERS", "CSPAWN_SERVERS"))
	switch name {
	case "local":
		return localSpawner{}, o.routeOutput, nil
	case "slurm":
		// vlink routes the output, so that it looks as with any other
		// spawner ("[R] "), and srun's step carries none.
		e.Log.Info("starting the workers with Slurm", "job", os.Getenv("SLURM_JOB_ID"), "command", slurmCommand)
		return &customSpawner{template: slurmCommand}, o.routeOutput, nil
	case "ssh":
		s, err := newSSHSpawner(o)
		return s, o.routeOutput, err
	case "custom":
		if o.custom == "" {
			return nil, false, base.Usagef("the custom spawner runs a command: --custom 'srun -n %%N %%C', or $VLINK_CSPAWN_CMD")
		}
		if err := checkTemplate(o.custom); err != nil {
			return nil, false, base.Usagef("--custom %q: %v", o.custom, err)
		}
		route := o.routeOutput
		if !routeSet {
			// As udp-conduit's: the command usually routes the output
			// itself (srun, mpirun); CSPAWN_ROUTE_OUTPUT=1 asks vlink to.
			v := seedEnv("CSPAWN_ROUTE_OUTPUT", "CSPAWN_ROUTE_OUTPUT")
			route = v != "" && v != "0" && v != "false"
		}
		return &customSpawner{template: o.custom, servers: strings.Fields(o.customServers)}, route, nil
	}
	return nil, false, base.Usagef("--spawner %q: want local, ssh, custom or slurm", name)
}

// workerCommand is the shell command that runs a worker's agent,
// reaching vlink launch at addr ("-": on its standard input and output).
func (j *job) workerCommand(addr string) (string, error) {
	vl := j.o.workerVLink
	if vl == "" {
		self, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("cannot tell where this vlink is (give --worker-vlink): %w", err)
		}
		vl = self
	}
	words := []string{vl, "launch", "--worker", addr, "--grace", j.o.grace.String(),
		"--route-output=" + strconv.FormatBool(j.route), "--log-level", j.e.Level.String(), "--"}
	words = append(words, j.e.Args...)
	for i, w := range words {
		words[i] = shellWord(w)
	}
	return strings.Join(words, " "), nil
}

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellWord quotes s for sh, if it needs it.
func shellWord(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// checkTemplate checks a custom command: it runs %C, and has no escape
// but those of udp-conduit's spawner.
func checkTemplate(t string) error {
	hasC := false
	for i := 0; i < len(t); i++ {
		if t[i] != '%' {
			continue
		}
		if i+1 == len(t) {
			return errors.New("ends with a lone %: write %% for a %")
		}
		i++
		switch t[i] {
		case 'C':
			hasC = true
		case 'N', 'D', 'M', 'P', '%':
		default:
			return fmt.Errorf("%%%c: the escapes are %%N %%C %%D %%M %%P and %%%%", t[i])
		}
	}
	if !hasC {
		return errors.New("it never runs %C, the command each worker must run")
	}
	return nil
}

// expandTemplate substitutes a custom command's escapes, as
// udp-conduit's spawner does: %N the number of workers, %C the
// command each runs, %D the current folder, %M the first N servers,
// %P the program as invoked, %% a %.
func expandTemplate(t string, n int, command, dir string, servers []string, program string) string {
	if len(servers) > n {
		servers = servers[:n]
	}
	ms := make([]string, len(servers))
	for i, s := range servers {
		ms[i] = shellWord(s)
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		if t[i] != '%' || i+1 == len(t) {
			b.WriteByte(t[i])
			continue
		}
		i++
		switch t[i] {
		case 'N':
			b.WriteString(strconv.Itoa(n))
		case 'C':
			b.WriteString(command)
		case 'D':
			b.WriteString(shellWord(dir))
		case 'M':
			b.WriteString(strings.Join(ms, " "))
		case 'P':
			b.WriteString(shellWord(program))
		case '%':
			b.WriteByte('%')
		}
	}
	return b.String()
}

// An agent is vlink launch's side of one worker's agent.
type agent struct {
	j     *job
	where string // the agent's machine, for messages
	task  uint32 // its hello's (jobwire.Hello.Task)
	r     io.Reader
	w     io.Writer
	wmu   sync.Mutex
}

func (a *agent) send(t jobwire.Type, p []byte) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return jobwire.WriteFrame(a.w, t, p)
}

// hello reads the agent's hello.
func (a *agent) hello() error {
	f, err := jobwire.ReadFrame(a.r)
	if err != nil {
		return err
	}
	if f.Type != jobwire.TypeHello {
		return fmt.Errorf("%w: a %v frame before the hello", jobwire.ErrFrame, f.Type)
	}
	h, err := jobwire.DecodeHello(f.Payload)
	if err != nil {
		return err
	}
	if h.Version != jobwire.Version {
		return fmt.Errorf("the vlink there speaks version %d of the launch protocol, this one %d: run the same vlink on every machine", h.Version, jobwire.Version)
	}
	if a.where == "" {
		a.where = h.Host
	}
	a.task = h.Task
	return nil
}

// feedRemote gives a remote worker its standard input: vlink launch's
// if it takes it (stdinFeed), else its end at once.
func (j *job) feedRemote(a *agent, r int) {
	if !j.stdin.wants(r) {
		a.send(jobwire.TypeStdin, nil)
		return
	}
	j.stdin.subscribe(func(p []byte) error { return a.send(jobwire.TypeStdin, p) }, func() { a.send(jobwire.TypeStdin, nil) })
}

// assign gives the agent rank r, and the relay as its machine reaches it.
func (a *agent) assign(r int, relay string) error {
	return a.send(jobwire.TypeAssign, jobwire.Assign{Rank: uint32(r), Size: uint32(a.j.o.n), Relay: relay,
		Key: vlink.NodeKey(a.j.key, launch.RankName(r)), Env: a.j.o.export}.Encode())
}

// follow passes rank w's output on, and returns how it ended, from the
// agent's exit frame; nil when the stream ended without one.
func (a *agent) follow(w *worker, stdout, stderr io.Writer) (*ending, error) {
	for {
		f, err := jobwire.ReadFrame(a.r)
		if err != nil {
			return nil, err
		}
		switch f.Type {
		case jobwire.TypeStdout:
			stdout.Write(f.Payload)
		case jobwire.TypeStderr:
			stderr.Write(f.Payload)
		case jobwire.TypeExit:
			x, err := jobwire.DecodeExit(f.Payload)
			if err != nil {
				return nil, err
			}
			if x.Signal != 0 {
				return &ending{w: w, code: 128 + int(x.Signal), why: fmt.Sprintf("was killed by signal %v on %s", syscall.Signal(x.Signal), a.where)}, nil
			}
			if x.Code != 0 {
				return &ending{w: w, code: int(x.Code), why: fmt.Sprintf("exited with status %d on %s", x.Code, a.where)}, nil
			}
			return &ending{w: w}, nil
		default:
			return nil, fmt.Errorf("%w: a %v frame from an agent", jobwire.ErrFrame, f.Type)
		}
	}
}

// sshSpawner starts each worker through SSH on one of the servers,
// rank R on server R modulo their number, with the ssh layer's
// configuration (~/.ssh/config, the agent, known_hosts). The job's
// relay is forwarded to each server (as ssh -R does), so the workers
// reach it however firewalled they are from vlink launch's machine.
type sshSpawner struct {
	servers   []string
	factories map[string]*sshf.Factory
	wg        sync.WaitGroup
}

func newSSHSpawner(o *launchOptions) (*sshSpawner, error) {
	// Spaces separate the servers; commas too, outside a range's [].
	var servers []string
	for _, word := range splitHosts(o.sshServers) {
		hosts, err := expandHosts(word)
		if err != nil {
			return nil, base.Usagef("--ssh-servers: %v", err)
		}
		servers = append(servers, hosts...)
	}
	if o.hostfile != "" {
		hosts, err := readHostfile(o.hostfile)
		if err != nil {
			return nil, base.Usagef("--hostfile: %v", err)
		}
		servers = append(servers, hosts...)
	}
	if len(servers) == 0 {
		return nil, base.Usagef("the ssh spawner needs servers to run the workers on: --ssh-servers 'host1 host2', --hostfile FILE, or $VLINK_SSH_SERVERS")
	}
	params := map[string]string{}
	if o.sshOptions != "" {
		// Parsed as a stack's ssh layer, with a stand-in for the host.
		st, err := vlink.Parse("ssh:host=h," + o.sshOptions)
		if err != nil || len(st.Layers) == 0 || st.Layers[0].Name != "ssh" {
			return nil, base.Usagef("--ssh-options %q: want the ssh layer's parameters, as name=value,name=value: %v", o.sshOptions, err)
		}
		params = st.Layers[0].Params
		delete(params, "host")
	}
	spec, _ := layer.Lookup("ssh")
	s := &sshSpawner{servers: servers, factories: map[string]*sshf.Factory{}}
	for _, server := range servers {
		if s.factories[server] != nil {
			continue
		}
		p := map[string]string{"host": server}
		for k, v := range params {
			p[k] = v
		}
		if err := spec.Check(p); err != nil {
			return nil, base.Usagef("--ssh-options: %v", err)
		}
		f, err := spec.Build(p)
		if err != nil {
			return nil, base.Usagef("ssh server %q: %v", server, err)
		}
		s.factories[server] = f.(*sshf.Factory)
	}
	return s, nil
}

func (s *sshSpawner) start(ctx context.Context, j *job) error {
	dir := j.o.remoteDir
	if dir == "" {
		var err error
		if dir, err = os.Getwd(); err != nil {
			return err
		}
	}
	command, err := j.workerCommand("-")
	if err != nil {
		return err
	}
	command = "cd " + shellWord(dir) + " && exec " + command
	// Every server at once: an SSH connection takes a few round trips,
	// and the relay's forward one more. The relay is forwarded to a
	// port on each server's loopback: only the workers' machine reaches
	// it there, and the relay's key keeps out the rest.
	var mu sync.Mutex
	var errs []error
	relays := map[string]string{}
	var wg sync.WaitGroup
	for server, f := range s.factories {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr, err := s.forwardRelay(ctx, j, f)
			if errors.Is(err, sshf.ErrListenRefused) && j.o.listenSet {
				// Told where the relay listens: the workers there reach
				// it themselves, as the custom spawner's do.
				if addr, err = j.relayAddr(); err == nil {
					j.e.Log.Info("the server's sshd refuses TCP forwarding: its workers reach the job's relay themselves", "server", server, "relay", addr)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, sshf.ErrListenRefused):
				errs = append(errs, fmt.Errorf("forwarding the job's relay to %s (its sshd must allow TCP forwarding, or give --relay-listen an address the servers reach, e.g. 0.0.0.0:0, for the workers to reach the relay themselves): %w", server, err))
			case err != nil: // the login itself: a host key, the user's keys, the network
				errs = append(errs, fmt.Errorf("reaching %s over SSH: %w", server, err))
			}
			relays[server] = addr
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Then every worker at once, each a session on its server's
	// connection.
	for r, w := range j.workers {
		server := s.servers[r%len(s.servers)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd, err := s.factories[server].Start(ctx, command, nil)
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("starting rank %d on %s: %w", r, server, err))
				mu.Unlock()
				return
			}
			// Until the agent says hello, a signal cannot reach the
			// worker: it waits for the hello (setSignal then delivers
			// it), and the last one, SIGKILL, ends the session instead.
			w.setSignal(func(sig syscall.Signal) {
				if sig == syscall.SIGKILL {
					cmd.Close()
					return
				}
				w.pending = sig // w.mu is held: kill calls this
			})
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				j.ended <- s.serve(j, w, server, cmd, relays[server])
			}()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// hostOf is the host in an ssh server's [user@]host[:port].
func hostOf(server string) string {
	host := server[strings.LastIndexByte(server, '@')+1:]
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return host
}

// relayAddr is where workers that connect themselves reach the job's
// relay: its host as --relay-listen gave it, or this machine's name when
// it listens on every address.
func (j *job) relayAddr() (string, error) {
	host, _, _ := net.SplitHostPort(j.o.listen)
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", err
		}
	}
	_, port, _ := net.SplitHostPort(j.relayL.Addr().String())
	return net.JoinHostPort(host, port), nil
}

// forwardRelay has server listen on a loopback port for the job's relay,
// and returns the port's address there.
func (s *sshSpawner) forwardRelay(ctx context.Context, j *job, f *sshf.Factory) (string, error) {
	fl, err := f.Listen(ctx, "tcp", "127.0.0.1:0", nil)
	if err != nil {
		return "", err
	}
	l, err := j.relay.NewListener(fl, j.key)
	if err != nil {
		fl.Close()
		return "", err
	}
	go j.relay.Serve(l) // closed with the relay
	return l.Addr().String(), nil
}

// serve follows rank w's agent on server to its end.
func (s *sshSpawner) serve(j *job, w *worker, server string, cmd *sshf.Command, relay string) ending {
	defer cmd.Close()
	stdout, stderr, flush := j.outputs(w.rank, hostOf(server))
	defer flush()
	// The agent's own complaints (a vlink that is not there, say) come
	// on the session's standard error.
	errDone := make(chan struct{})
	go func() {
		io.Copy(stderr, cmd.Stderr)
		close(errDone)
	}()
	a := &agent{j: j, where: server, r: cmd.Stdout, w: cmd.Stdin}
	err := a.hello()
	if err == nil {
		err = a.assign(w.rank, relay)
	}
	var end *ending
	if err == nil {
		w.setSignal(func(sig syscall.Signal) {
			a.send(jobwire.TypeSignal, []byte{byte(sig)})
			if sig == syscall.SIGKILL {
				// An agent that cannot pass SIGKILL on is ended with
				// its session, which ends the worker too.
				time.AfterFunc(2*time.Second, func() { cmd.Close() })
			}
		})
		a.j.feedRemote(a, w.rank)
		end, err = a.follow(w, stdout, stderr)
	}
	// The agent ends once it stopped what the worker left running, in
	// --grace; one that does not is not waited for beyond that.
	t := time.AfterFunc(j.o.grace+10*time.Second, func() { cmd.Close() })
	werr := cmd.Wait()
	t.Stop()
	<-errDone
	if end != nil {
		return *end
	}
	var ee interface{ ExitStatus() int }
	switch {
	case errors.As(werr, &ee) && ee.ExitStatus() == 127:
		return ending{w: w, code: base.ExitFailure, why: fmt.Sprintf("could not start on %s: no vlink at %s there (give --worker-vlink the path of vlink on the servers)", server, cmp.Or(j.o.workerVLink, "this vlink's path"))}
	case errors.Is(werr, sshf.ErrLost):
		return ending{w: w, code: base.ExitFailure, why: fmt.Sprintf("was lost with the ssh connection to %s: %v", server, werr)}
	}
	return ending{w: w, code: base.ExitFailure, why: fmt.Sprintf("ended on %s without a word from its agent (%v; the session: %v)", server, err, werr)}
}

func (s *sshSpawner) stop() {}

func (s *sshSpawner) wait() { s.wg.Wait() }

// stdinQueue bounds the chunks of a worker's input its agent holds.
const stdinQueue = 32

// schedulerTask returns this agent's place as the scheduler that
// started it numbered it, plus one, for vlink launch to make it the
// worker's rank: Slurm's SLURM_PROCID, PMIx's PMIX_RANK, Open MPI's
// OMPI_COMM_WORLD_RANK or MPICH's PMI_RANK; 0 for none.
func schedulerTask() uint32 {
	for _, v := range []string{"SLURM_PROCID", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"} {
		if n, err := strconv.ParseUint(os.Getenv(v), 10, 31); err == nil {
			return uint32(n) + 1
		}
	}
	return 0
}

// customSpawner runs the user's command once, which starts the N
// agents (srun, mpirun, a script of the user's); each agent connects
// back to vlink launch, proves the job's secret, and is given the rank
// its scheduler gave it (jobwire.Hello.Task) if that one is free, else
// the lowest free one.
type customSpawner struct {
	template string
	servers  []string
	j        *job
	cmd      *exec.Cmd
	boot     net.Listener
	exited   chan struct{} // the command is gone

	mu      sync.Mutex
	taken   []bool // the ranks given
	started int    // how many
	stopped bool   // the job is stopping: no more ranks
	wg      sync.WaitGroup
}

func (s *customSpawner) start(ctx context.Context, j *job) error {
	s.j = j
	s.taken = make([]bool, j.o.n)
	secret := make([]byte, 32)
	rand.Read(secret)
	host, _, _ := net.SplitHostPort(j.o.listen)
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: secret, Layers: []string{vlink.EncryptionLayer}, Plain: vlink.PlainRefuse}}
	boot, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("listening for the workers' agents: %w", err)
	}
	s.boot = boot
	// The workers reach the relay, and this listener, at the relay's
	// host, or this machine's name when it listens on every address.
	relay, err := j.relayAddr()
	if err != nil {
		boot.Close()
		return err
	}
	host, _, _ = net.SplitHostPort(relay)
	_, bootPort, _ := net.SplitHostPort(boot.Addr().String())
	command, err := j.workerCommand(net.JoinHostPort(host, bootPort))
	if err != nil {
		boot.Close()
		return err
	}
	dir, err := os.Getwd()
	if err != nil {
		boot.Close()
		return err
	}
	line := expandTemplate(s.template, j.o.n, command, dir, s.servers, j.e.Args[0])
	j.e.Log.Info("running the custom spawner", "command", line)
	s.cmd = exec.Command("/bin/sh", "-c", line)
	s.cmd.Env = append(os.Environ(), envLaunchSecret+"="+hex.EncodeToString(secret))
	s.cmd.Stdout, s.cmd.Stderr = j.e.Stdout, j.e.Stderr
	s.cmd.SysProcAttr = workerAttr()
	s.cmd.WaitDelay = 200 * time.Millisecond
	if err := s.cmd.Start(); err != nil {
		boot.Close()
		return fmt.Errorf("running the custom command: %w", err)
	}
	j.guard.watch(s.cmd.Process.Pid)
	s.exited = make(chan struct{})
	go s.waitCommand()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.accept(relay)
	}()
	return nil
}

// waitCommand follows the custom command: one that fails before it
// started every worker fails the job; once every worker connected, the
// workers' own ends tell the job's.
func (s *customSpawner) waitCommand() {
	s.cmd.Wait()
	close(s.exited)
	st := s.cmd.ProcessState
	s.mu.Lock()
	started, stopped := s.started, s.stopped
	s.mu.Unlock()
	switch {
	case stopped:
	case started == s.j.o.n:
		if !st.Success() {
			s.j.e.Log.Warn("the custom command failed after it started every worker", "status", describeExit(st))
		}
	case !st.Success():
		s.j.ended <- ending{code: workerStatus(st), why: fmt.Sprintf("the custom command %s having started %d of %d workers", describeExit(st), started, s.j.o.n)}
	}
}

func (s *customSpawner) accept(relay string) {
	for {
		c, err := s.boot.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c, relay)
		}()
	}
}

// serve gives the agent on c the next rank and follows it to its end.
func (s *customSpawner) serve(c net.Conn, relay string) {
	defer c.Close()
	log := s.j.e.Log.With("remote", c.RemoteAddr().String())
	a := &agent{j: s.j, r: c, w: c}
	c.SetDeadline(time.Now().Add(agentHelloTimeout))
	if err := a.hello(); err != nil {
		log.Warn("refused a worker's agent", "err", err)
		return
	}
	s.mu.Lock()
	r := -1
	if !s.stopped {
		r = s.pick(int(a.task) - 1)
	}
	s.mu.Unlock()
	if r < 0 {
		log.Warn("refused a worker beyond the job's size: the custom command started more than %N", "size", s.j.o.n)
		return
	}
	w := s.j.workers[r]
	stdout, stderr, flush := s.j.outputs(r, a.where)
	end := func() *ending {
		if err := a.assign(r, relay); err != nil {
			return &ending{w: w, code: base.ExitFailure, why: fmt.Sprintf("was lost on %s before it started: %v", a.where, err)}
		}
		c.SetDeadline(time.Time{})
		w.setSignal(func(sig syscall.Signal) {
			c.SetWriteDeadline(time.Now().Add(agentHelloTimeout))
			a.send(jobwire.TypeSignal, []byte{byte(sig)})
			if sig == syscall.SIGKILL {
				// An agent that cannot pass SIGKILL on is cut off,
				// which ends the worker too.
				time.AfterFunc(2*time.Second, func() { c.Close() })
			}
		})
		s.j.feedRemote(a, r)
		end, err := a.follow(w, stdout, stderr)
		if end == nil {
			end = &ending{w: w, code: base.ExitFailure, why: fmt.Sprintf("was lost on %s: its agent's connection ended without its exit (%v)", a.where, err)}
		}
		return end
	}()
	flush()
	s.j.ended <- *end
}

// pick gives an agent rank want if it is free, else the lowest free
// rank; -1 when every rank is given. s.mu is held.
func (s *customSpawner) pick(want int) int {
	if want < 0 || want >= len(s.taken) || s.taken[want] {
		want = slices.Index(s.taken, false)
	}
	if want >= 0 {
		s.taken[want] = true
		s.started++
	}
	return want
}

// stop takes no more workers, counts the ones never started as ended,
// and stops the custom command.
func (s *customSpawner) stop() {
	s.boot.Close()
	s.mu.Lock()
	s.stopped = true
	for r, taken := range s.taken {
		if !taken {
			s.taken[r] = true
			s.j.ended <- ending{w: s.j.workers[r], code: base.ExitFailure, why: "was never started by the custom command"}
		}
	}
	s.mu.Unlock()
	signalWorker(s.cmd.Process, syscall.SIGTERM)
}

func (s *customSpawner) wait() {
	s.boot.Close()
	select {
	case <-s.exited:
	case <-time.After(s.j.o.grace):
		signalWorker(s.cmd.Process, syscall.SIGKILL)
		<-s.exited
	}
	s.wg.Wait()
}

// frameWriter sends what a worker writes as frames of type t.
type frameWriter struct {
	t    jobwire.Type
	send func(jobwire.Type, []byte) error
}

func (f *frameWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += jobwire.MaxPayload {
		if err := f.send(f.t, p[off:min(len(p), off+jobwire.MaxPayload)]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// runWorker is a worker's agent (vlink launch --worker ADDR): see the
// comment at the top of this file.
func runWorker(ctx context.Context, e *base.Env, o *launchOptions) int {
	failed := func(err error) int {
		fmt.Fprintf(e.Stderr, "vlink launch --worker: %v\n", err)
		return base.ExitFailure
	}
	if len(e.Args) == 0 {
		return failed(errors.New("no program to run after --"))
	}
	var rw io.ReadWriter
	route := o.routeOutput
	if o.worker == "-" {
		rw, route = struct {
			io.Reader
			io.Writer
		}{e.Stdin, e.Stdout}, true // standard output carries the frames
	} else {
		secret, err := hex.DecodeString(os.Getenv(envLaunchSecret))
		if err != nil || len(secret) < vlink.MinKeySize {
			return failed(fmt.Errorf("$%s is missing or malformed: the custom command must pass vlink launch's environment on to the workers", envLaunchSecret))
		}
		os.Unsetenv(envLaunchSecret)
		dctx, cancel := context.WithTimeout(ctx, agentHelloTimeout)
		d := vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Key: secret}
		c, err := d.DialContext(dctx, "tcp", o.worker)
		cancel()
		if err != nil {
			return failed(fmt.Errorf("reaching vlink launch at %s: %w", o.worker, err))
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(agentHelloTimeout))
		defer c.SetReadDeadline(time.Time{})
		rw = c
	}
	host, _ := os.Hostname()
	var wmu sync.Mutex
	send := func(t jobwire.Type, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return jobwire.WriteFrame(rw, t, p)
	}
	if err := send(jobwire.TypeHello, jobwire.Hello{Version: jobwire.Version, Host: host, Task: schedulerTask()}.Encode()); err != nil {
		return failed(err)
	}
	f, err := jobwire.ReadFrame(rw)
	if err == nil && f.Type != jobwire.TypeAssign {
		err = fmt.Errorf("%w: a %v frame, want the assignment", jobwire.ErrFrame, f.Type)
	}
	var a jobwire.Assign
	if err == nil {
		a, err = jobwire.DecodeAssign(f.Payload)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			// vlink launch had a rank for every worker already.
			return failed(errors.New("vlink launch gave this worker no rank: the job has all its workers"))
		}
		return failed(fmt.Errorf("waiting for a rank: %w", err))
	}
	if c, ok := rw.(net.Conn); ok {
		c.SetReadDeadline(time.Time{})
	}
	exit := func(x jobwire.Exit) int {
		send(jobwire.TypeExit, x.Encode())
		if x.Signal != 0 {
			return 128 + int(x.Signal)
		}
		return int(x.Code)
	}
	dir, err := os.MkdirTemp("", "vlink-launch-")
	if err != nil {
		return failed(err)
	}
	defer os.RemoveAll(dir)
	// Should this agent be killed, its guard stops what the worker
	// started (the kernel kills the worker) and removes the key.
	g := startGuard(e, o.grace)
	defer g.done()
	g.remove(dir)
	name := launch.RankName(int(a.Rank))
	keyFile := filepath.Join(dir, name+".key")
	if err := os.WriteFile(keyFile, a.Key, 0o600); err != nil {
		return failed(err)
	}
	var stdout, stderr io.Writer = e.Stdout, e.Stderr
	if route {
		stdout, stderr = &frameWriter{t: jobwire.TypeStdout, send: send}, &frameWriter{t: jobwire.TypeStderr, send: send}
	}
	path, err := exec.LookPath(e.Args[0])
	if err != nil {
		fmt.Fprintf(stderr, "vlink launch --worker on %s: cannot run %s: %v\n", host, e.Args[0], err)
		return exit(jobwire.Exit{Code: 127})
	}
	cmd := exec.Command(path, e.Args[1:]...)
	cmd.Env = slices.Concat(os.Environ(), a.Env, workerEnv(int(a.Rank), int(a.Size), a.Relay, keyFile))
	cmd.SysProcAttr = workerAttr()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 200 * time.Millisecond
	// The worker's input comes from vlink launch, in stdin frames.
	inR, inW, err := os.Pipe()
	if err != nil {
		return failed(err)
	}
	cmd.Stdin = inR
	jl := holdJob(e, g)
	defer jl.stop(o.grace) // what the worker left, after its group below
	err = jl.start(cmd)
	inR.Close()
	if err != nil {
		inW.Close()
		fmt.Fprintf(stderr, "vlink launch --worker on %s: %v\n", host, err)
		return exit(jobwire.Exit{Code: 126})
	}
	// Written apart from the frames, so that a worker that does not read
	// holds up no signal; at most stdinQueue chunks wait.
	stdin := make(chan []byte, stdinQueue)
	// The channel passed, not the variable: the frames' reader sets that
	// to nil at the input's end, maybe before this starts.
	go func(in <-chan []byte) {
		for p := range in {
			inW.Write(p) // one that fails (the worker is gone) drops the rest
		}
		inW.Close()
	}(stdin)
	g.watch(cmd.Process.Pid)
	// vlink launch's signals, and the end of its stream: vlink launch,
	// or the connection to it, is gone.
	lost := make(chan struct{})
	go func() {
		defer close(lost)
		defer func() {
			if stdin != nil {
				close(stdin) // vlink launch is gone: so is the input
			}
		}()
		for {
			f, err := jobwire.ReadFrame(rw)
			if err != nil {
				return
			}
			switch f.Type {
			case jobwire.TypeSignal:
				if sig, err := jobwire.DecodeSignal(f.Payload); err == nil {
					signalWorker(cmd.Process, syscall.Signal(sig))
				}
			case jobwire.TypeStdin:
				if stdin == nil {
					break // after its end: ignored
				}
				if len(f.Payload) == 0 {
					close(stdin)
					stdin = nil
					break
				}
				stdin <- f.Payload
			}
		}
	}()
	waited := make(chan struct{})
	go func() {
		cmd.Wait()
		cleanUp(a.Env, int(a.Rank))
		close(waited)
	}()
	select {
	case <-waited:
	case <-lost:
	case <-ctx.Done():
	}
	select {
	case <-waited:
	default:
		e.Log.Info("stopping the worker: vlink launch is gone, or this agent was asked to stop", "rank", a.Rank)
		signalWorker(cmd.Process, syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(o.grace):
			signalWorker(cmd.Process, syscall.SIGKILL)
			<-waited
		}
	}
	st := cmd.ProcessState
	x := jobwire.Exit{Code: uint8(st.ExitCode())}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x = jobwire.Exit{Signal: uint8(ws.Signal())}
	}
	code := exit(x)
	// What the worker left running in its process group goes with it.
	pgid := cmd.Process.Pid
	if signalGroup(pgid, syscall.SIGTERM) {
		for deadline := time.Now().Add(o.grace); time.Now().Before(deadline) && signalGroup(pgid, 0); {
			time.Sleep(20 * time.Millisecond)
		}
		signalGroup(pgid, syscall.SIGKILL)
	}
	return code
}

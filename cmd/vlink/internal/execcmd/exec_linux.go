//go:build linux

package execcmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/procs"
	"github.com/vlink-dev/vlink/preload"
	"github.com/vlink-dev/vlink/vlink"
)

// buildShimTo compiles the shim into file (mode 755, replaced whole).
func buildShimTo(file string) error {
	dir, err := os.MkdirTemp("", "vlink-shim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	so, err := preload.BuildShim(dir)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(so)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// passedOn are the signals vlink exec passes on to the program.
var passedOn = []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// execProgram runs the program with the shim and a private agent, and
// returns its exit code once it and every process it left behind are
// gone: -N if signal N killed it, for vlink exec to end by N too.
func execProgram(ctx context.Context, e *base.Env, o *execOptions, cfg *vlink.Config) (int, error) {
	// Caught from here on, so that a signal before the program starts
	// still lets the agent and the shim's build clean up. One ignored when
	// vlink started (nohup, a script's background job) stays ignored: the
	// program inherits it so, as without vlink.
	sigs := make(chan os.Signal, 8)
	for _, s := range passedOn {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	defer signal.Stop(sigs)

	name := e.Args[0]
	path, code, err := findProgram(e, o, name)
	if err != nil {
		return code, err
	}
	shim, err := preload.ShimPath("")
	if err != nil {
		return ExitExecFailed, err
	}
	ac := preload.AgentConfig{Config: cfg, DialTimeout: o.dialTimeout, Logger: e.Log, Network: o.network, Member: o.node.Member(),
		InsecurePlaintext: o.plaintext, StandIns: o.standIns,
		Observe: func(c preload.ConnectOutcome) { o.m.Connected(c.String()) }}
	if o.servePorts != nil {
		ac.Serve = &preload.ServeConfig{Ports: o.servePorts, Listen: vlink.ListenConfig{Policy: o.servePolicy, Logger: e.Log}}
	}
	agent, err := preload.NewAgent(ac)
	if err != nil {
		return ExitExecFailed, err
	}
	defer agent.Close()
	e.Log.Debug("agent", "socket", agent.Name(), "shim", shim, "routes", cfg.String())

	// Orphans (daemons, children of a parent that exited) become ours,
	// so that the agent outlives every process that may still use it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		e.Log.Warn("cannot become a subreaper: processes the program leaves behind may outlive the agent", "err", err)
	}

	cmd := exec.Command(path, e.Args[1:]...)
	cmd.Args[0] = name
	cmd.Env = preloadEnv(os.Environ(), shim, agent.Env())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.Stdout, e.Stderr
	select {
	case s := <-sigs:
		return -int(s.(syscall.Signal)), nil // what the signal would have done to us
	default:
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return exitCannotRun, err
		}
		return ExitExecFailed, err
	}
	code, done := waitProgram(ctx.Done(), cmd, sigs)

	// The processes it left behind (reparented to us) still use the agent.
	if left := procs.Children(os.Getpid()); len(left) > 0 {
		e.Log.Info("the program exited; waiting for the processes it left running", "pids", fmt.Sprint(left))
	}
	waitLeftBehind(done, sigs)
	return code, nil
}

// findProgram looks the program up in PATH and checks that the shim can
// reach its connections, or that the user allowed it not to.
func findProgram(e *base.Env, o *execOptions, name string) (path string, code int, err error) {
	path, err = exec.LookPath(name)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return "", exitNotFound, fmt.Errorf("%s: program not found", name)
		}
		return "", exitCannotRun, err
	}
	if err := preload.Inspect(path); err != nil {
		var ue *preload.UnreachableError
		if !errors.As(err, &ue) {
			return "", exitCannotRun, err
		}
		if !o.allowBypass {
			return "", ExitExecFailed, fmt.Errorf("%v; carry its connections with vlink tunnel instead, "+
				"or run it anyway with --allow-bypass (its connections then go direct)", err)
		}
		e.Log.Warn("running a program the shim cannot reach: its connections bypass vlink", "why", err.Error())
	}
	return path, base.ExitOK, nil
}

// waitProgram passes the signals vlink exec receives on to the program,
// each as itself and once, until it exits, and returns its exit code. A
// signal changes nothing else: the program decides whether it ends. done
// closing (the command's context ending, which no signal does) stands
// for SIGTERM, once: the done returned is nil if it was passed on already.
func waitProgram(done <-chan struct{}, cmd *exec.Cmd, sigs <-chan os.Signal) (int, <-chan struct{}) {
	waited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(waited)
	}()
	for {
		select {
		case s := <-sigs:
			if !sentByTerminal(s, cmd.Process.Pid) {
				cmd.Process.Signal(s)
			}
		case <-done:
			done = nil
			cmd.Process.Signal(syscall.SIGTERM)
		case <-waited:
			return exitCode(cmd.ProcessState), done
		}
	}
}

// waitLeftBehind reaps the processes the program left running, which
// became ours, passing signals on to them, until none is left. A Ctrl-C
// reaches those outside the terminal's foreground group (daemons) only
// this way: it is how the user stops the wait.
func waitLeftBehind(done <-chan struct{}, sigs <-chan os.Signal) {
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
				return
			}
		}
	}()
	for {
		select {
		case s := <-sigs:
			for _, pid := range procs.Children(os.Getpid()) {
				if !sentByTerminal(s, pid) {
					syscall.Kill(pid, s.(syscall.Signal))
				}
			}
		case <-done:
			done = nil
			for _, pid := range procs.Children(os.Getpid()) {
				syscall.Kill(pid, syscall.SIGTERM)
			}
		case <-reaped:
			return
		}
	}
}

// preloadEnv adds the shim to LD_PRELOAD (first, before any other) and
// points it at the agent.
func preloadEnv(environ []string, shim string, agentVars []string) []string {
	out := make([]string, 0, len(environ)+1+len(agentVars))
	preloads := shim
	ours := map[string]bool{}
	for _, kv := range agentVars {
		k, _, _ := strings.Cut(kv, "=")
		ours[k] = true
	}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "LD_PRELOAD":
			if v != "" {
				preloads += ":" + v
			}
			continue
		case ours[k]:
			continue
		}
		out = append(out, kv)
	}
	out = append(out, "LD_PRELOAD="+preloads)
	return append(out, agentVars...)
}

// exitCode is the program's exit status, or -N if signal N killed it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal())
	}
	return ps.ExitCode()
}

// sentByTerminal reports whether s reached pid from the terminal already:
// a SIGINT or SIGQUIT typed at the keyboard goes to the whole foreground
// process group of the terminal, so when that group is ours, it came from
// there (or so we must assume), and pid got it too if it is in the group.
// Passing it on would deliver it twice.
func sentByTerminal(s os.Signal, pid int) bool {
	if s != syscall.SIGINT && s != syscall.SIGQUIT {
		return false
	}
	fg := foregroundGroup()
	if fg != unix.Getpgrp() {
		return false
	}
	pg, err := unix.Getpgid(pid)
	return err == nil && pg == fg
}

// foregroundGroup returns the foreground process group of our controlling
// terminal, or -1 without one. The terminal need not be on stdin: Ctrl-C
// in "cat file | vlink exec ..." signals the whole pipeline.
func foregroundGroup() int {
	fd, err := unix.Open("/dev/tty", unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	defer unix.Close(fd)
	pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return pgrp
}

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// vlinkCommand runs this test binary as vlink (see TestMain) with args,
// in a session of its own: no terminal sends it anything unless the test
// gives it one.
func vlinkCommand(t *testing.T, args ...string) (*exec.Cmd, *output) {
	t.Helper()
	testenv.Programs(t, "cc", "sh", "sleep") // vlink exec builds its shim
	if signal.Ignored(syscall.SIGINT) {
		testenv.Missing(t, "needs SIGINT not ignored (the tests were started in the background): the programs would inherit it ignored")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envAsVlink+"=1")
	cmd.Dir = t.TempDir() // for any core file
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd, out
}

// waitExit waits for cmd's process and returns how it ended.
func waitExit(t *testing.T, cmd *exec.Cmd, out *output) syscall.WaitStatus {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.Sys().(syscall.WaitStatus)
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("vlink exec still runs; output:\n%s", out.String())
		return 0
	}
}

// ending says how a process ended, for test failures.
func ending(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return fmt.Sprintf("killed by %v", ws.Signal())
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// openPTY returns a new pseudo-terminal's master and slave ends.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		testenv.Missing(t, "needs a pseudo-terminal (/dev/ptmx): %v", err)
	}
	t.Cleanup(func() { master.Close() })
	rc, err := master.SyscallConn() // not Fd: the master stays non-blocking
	if err != nil {
		t.Fatal(err)
	}
	var n int
	rc.Control(func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err == nil {
			n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	})
	if err != nil {
		t.Fatalf("unlocking the pseudo-terminal: %v", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return master, slave
}

// Ctrl-C in a terminal reaches the program from the terminal, once, and
// vlink exec does not end the program for it: a program that handles
// SIGINT goes on, as without vlink (issue 38, point 7).
func TestExecTerminalInterrupt(t *testing.T) {
	cmd, _ := vlinkCommand(t, "exec", "--config", "/dev/null", "--", "sh", "-c",
		`trap 'echo caught; n=1' INT; echo ready; while [ -z "$n" ]; do sleep 0.1; done; echo after; exit 3`)
	master, slave := openPTY(t)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr.Setctty = true // the terminal on stdin, vlink's group in its foreground
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var out output
	copied := make(chan struct{})
	go func() {
		io.Copy(&out, master) // until EIO: every process holding the terminal is gone
		close(copied)
	}()
	out.waitFor(t, "ready")
	if _, err := master.Write([]byte{3}); err != nil { // ^C
		t.Fatal(err)
	}
	ws := waitExit(t, cmd, &out)
	select {
	case <-copied: // all of the output
	case <-time.After(5 * time.Second):
		t.Error("the terminal is still open after vlink exec exited")
	}
	if ws.Signaled() || ws.ExitStatus() != 3 {
		t.Errorf("vlink exec: %s, want the program's exit status 3; output:\n%s", ending(ws), out.String())
	}
	if n := strings.Count(out.String(), "caught"); n != 1 || !strings.Contains(out.String(), "after") {
		t.Errorf("the program caught SIGINT %d times (want once) or did not go on; output:\n%s", n, out.String())
	}
}

// A SIGINT sent to vlink exec alone is passed on as SIGINT, once, with no
// SIGTERM after it, and vlink exec waits for the program.
func TestExecForwardsInterrupt(t *testing.T) {
	cmd, out := vlinkCommand(t, "exec", "--config", "/dev/null", "--", "sh", "-c",
		`trap 'echo got INT; n=1' INT; trap 'echo got TERM' TERM; echo ready
while [ -z "$n" ]; do sleep 0.1; done; sleep 0.5; exit 7`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "ready")
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	ws := waitExit(t, cmd, out)
	if ws.Signaled() || ws.ExitStatus() != 7 {
		t.Errorf("vlink exec: %s, want the program's exit status 7; output:\n%s", ending(ws), out.String())
	}
	if n := strings.Count(out.String(), "got INT"); n != 1 || strings.Contains(out.String(), "got TERM") {
		t.Errorf("the program got SIGINT %d times (want once), or SIGTERM; output:\n%s", n, out.String())
	}
}

// A program killed by a signal makes vlink exec die by the same signal,
// without a core dump of its own, so that a shell sees how the program
// ended (issue 38, point 8).
func TestExecReraisesSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGSEGV} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			cmd, out := vlinkCommand(t, "exec", "--config", "/dev/null", "--", "sh", "-c",
				fmt.Sprintf("ulimit -c 0; read x; kill -%d $$", sig))
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Allow vlink a core file, to see that it makes none.
			var lim unix.Rlimit
			if err := unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CORE, nil, &lim); err == nil && lim.Max > 0 {
				lim.Cur = lim.Max
				unix.Prlimit(cmd.Process.Pid, unix.RLIMIT_CORE, &lim, nil)
			}
			io.WriteString(stdin, "go\n")
			ws := waitExit(t, cmd, out)
			if !ws.Signaled() || ws.Signal() != sig {
				t.Errorf("vlink exec: %s, want killed by %v, as its program; output:\n%s", ending(ws), sig, out.String())
			}
			if ws.CoreDump() {
				t.Errorf("vlink exec dumped core")
			}
		})
	}
}

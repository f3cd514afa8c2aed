package launcher

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// workerAttr puts a worker in a process group of its own, so that a
// signal reaches what it started too, and has the kernel kill it should
// vlink launch die first.
func workerAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalWorker signals p's process group.
func signalWorker(p *os.Process, sig syscall.Signal) {
	if syscall.Kill(-p.Pid, sig) != nil {
		p.Signal(sig)
	}
}

// guardAttr puts the guard in a session of its own: the terminal's
// signals, and vlink launch's death, leave it running.
func guardAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// signalGroup signals process group pgid, and reports whether it had a
// process to signal.
func signalGroup(pgid int, sig syscall.Signal) bool { return syscall.Kill(-pgid, sig) == nil }

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// inBackground reports whether f is a terminal this process runs in the
// background of (vlink launch ... & in an interactive shell): reading it
// would stop the whole job (SIGTTIN).
func inBackground(f *os.File) bool {
	pgrp, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp != unix.Getpgrp()
}

//go:build !linux

package launcher

import (
	"os"
	"syscall"
)

// workerAttr: only Linux has a parent-death signal; elsewhere a worker
// outlives a launcher killed with SIGKILL.
func workerAttr() *syscall.SysProcAttr { return nil }

func signalWorker(p *os.Process, sig syscall.Signal) { p.Signal(sig) }

func guardAttr() *syscall.SysProcAttr { return nil }

// signalGroup: no process groups here; the guard has nothing to do.
func signalGroup(int, syscall.Signal) bool { return false }

// isTerminal: taken for one, so that the input is copied rather than
// shared.
func isTerminal(*os.File) bool { return true }

func inBackground(*os.File) bool { return false }

//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// detachAttr puts the background "up" in a session of its own, so that
// the terminal's signals and hang-up do not reach it.
func detachAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

func terminate(pid int) error { return syscall.Kill(pid, syscall.SIGTERM) }

func exitSignal(xe *exec.ExitError) int {
	if ws, ok := xe.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return int(ws.Signal())
	}
	return 0
}

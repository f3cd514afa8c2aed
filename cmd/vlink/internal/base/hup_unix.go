//go:build unix

package base

import (
	"os"
	"os/signal"
	"syscall"
)

// notifyHangup sends SIGHUP to c: files are read again, as sshd and
// nginx take it.
func notifyHangup(c chan<- os.Signal) { signal.Notify(c, syscall.SIGHUP) }

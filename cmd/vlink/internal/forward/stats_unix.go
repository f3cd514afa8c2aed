//go:build unix

package forward

import (
	"os"
	"os/signal"
	"syscall"
)

// notifySnapshot sends SIGUSR1 to c, as iperf3 and chisel take it.
func notifySnapshot(c chan<- os.Signal) { signal.Notify(c, syscall.SIGUSR1) }

func stopSnapshot(c chan<- os.Signal) { signal.Stop(c) }

// notifyReload sends SIGHUP to c: a --forwards file is read again, as
// sshd and nginx take it.
func notifyReload(c chan<- os.Signal) { signal.Notify(c, syscall.SIGHUP) }

func stopReload(c chan<- os.Signal) { signal.Stop(c) }

//go:build !unix

package forward

import "os"

// notifySnapshot: no SIGUSR1 here; --stats still reports.
func notifySnapshot(chan<- os.Signal) {}

func stopSnapshot(chan<- os.Signal) {}

// notifyReload: no SIGHUP here; a --forwards file is read once.
func notifyReload(chan<- os.Signal) {}

func stopReload(chan<- os.Signal) {}

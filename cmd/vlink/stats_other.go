//go:build !unix

package main

import "os"

// notifySnapshot: no SIGUSR1 here; --stats still reports.
func notifySnapshot(chan<- os.Signal) {}

func stopSnapshot(chan<- os.Signal) {}

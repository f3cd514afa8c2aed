//go:build !unix

package base

import "os"

// notifyHangup: no SIGHUP here; files are read once.
func notifyHangup(chan<- os.Signal) {}

//go:build unix

package testnet

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user and system) this process has
// used so far, for benchmarks that report CPU per operation.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

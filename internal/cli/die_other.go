//go:build !linux

package cli

import "syscall"

// dieBySignal returns 128+N, the shell's code for a death by signal N:
// only on Linux does a command pass a program's death on (vlink exec).
func dieBySignal(sig syscall.Signal) int { return 128 + int(sig) }

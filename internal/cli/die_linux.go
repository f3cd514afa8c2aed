package cli

import (
	"os/signal"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dieBySignal ends the process by sig, as sig's default action would, so
// that its parent sees it killed by sig: a shell stops its loop on
// SIGINT, says "Segmentation fault" for SIGSEGV. It returns the exit code
// to use instead, 128+N, only if sig did not end the process.
func dieBySignal(sig syscall.Signal) int {
	switch sig {
	case syscall.SIGSTOP, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU:
		return 128 + int(sig) // these stop a process, they never end one
	}
	// The crash was the program's: no core file of ours beside its own.
	unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	signal.Reset(sig)
	// The runtime keeps its own handler for the signals it needs, which
	// would print a traceback for SIGSEGV or drop SIGUSR1: set the
	// kernel's default by hand, as the runtime does when it dies by a
	// signal, unblock it, and send it to this very thread.
	runtime.LockOSThread()
	// A struct sigaction of zeros is SIG_DFL, no flags, an empty mask; the
	// kernel wants the size of its sigset_t, 16 bytes on MIPS.
	var act [64]byte
	for _, size := range []uintptr{8, 16} {
		_, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, size, 0, 0)
		if errno != unix.EINVAL {
			break
		}
	}
	var set unix.Sigset_t
	bits := int(unsafe.Sizeof(set.Val[0])) * 8
	set.Val[(int(sig)-1)/bits] |= 1 << ((int(sig) - 1) % bits)
	unix.PthreadSigmask(unix.SIG_UNBLOCK, &set, nil)
	unix.Tgkill(unix.Getpid(), unix.Gettid(), sig)
	return 128 + int(sig)
}

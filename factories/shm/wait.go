//go:build linux

package shm

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// How a side waits for its peer: it polls the ring a moment (spin),
// then sleeps on a futex on the ring's want word for a while, then on
// its eventfd doorbell through the runtime's poller. The want word says
// which, so the producer wakes the sleeper the right way:
//
//	0          awake: the producer does nothing
//	wantBell   asleep on the doorbell: the producer rings it
//	wantFutex  asleep on the futex: the producer wakes it (FUTEX_WAKE)
//
// The futex is what keeps the round trip short on a busy machine: a
// FUTEX_WAKE readies the sleeping thread itself, where a doorbell wakes
// the runtime's poller, which then hands the goroutine to a thread, two
// wake-ups that each wait for a core while other processes hold them.
// But a thread asleep on a futex is a thread, where a goroutine asleep
// on the poller is not, and it holds its P (the runtime's right to run
// Go code) until the runtime's monitor takes it back, 20 µs to 10 ms
// later: so a side sleeps on it for futexTime at most, and at most
// maxFutexSleepers at once in this process, and never all of its Ps
// (with GOMAXPROCS=1, none): the rest sleep on their doorbells, as
// before the futex. A peer from before the futex reads wantFutex as
// "asleep" and rings the doorbell, which the sleeper finds when its
// futex time ends.
const (
	wantBell  = 1
	wantFutex = 2
)

// The futex operations (linux/futex.h), which x/sys/unix does not name.
const (
	opFutexWait = 0
	opFutexWake = 1
)

var (
	// futexTime bounds a sleep on the futex; a longer wait goes on on
	// the doorbell.
	futexTime = time.Millisecond
	// maxFutexSleepers bounds the threads this process parks on futexes.
	maxFutexSleepers int32 = 16
	futexSleepers    atomic.Int32
)

// spinTime bounds how long a reader or writer polls the ring before it
// sleeps.
var spinTime = 10 * time.Microsecond

// spin polls ready for up to spinTime, and reports whether it became
// true: a peer that answers within it is read without a wake-up, which
// costs more than the round trip itself. On a busy machine the poll
// rarely pays, but costs little beside the futex's wake-up (BENCHMARKS
// §4, "shm on a busy machine").
func spin(ready func() bool) bool {
	start := time.Now()
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%64 == 0 && time.Since(start) > spinTime {
			return false
		}
	}
}

// sleep waits until ready() holds (or may: the caller looks again), on
// want, the word the producer checks, and bell, this side's doorbell for
// it; dl is the direction's deadline. It returns the doorbell's error
// (a deadline passed, the connection closed).
func (c *conn) sleep(want *uint32, bell *os.File, dl *deadline, ready func() bool) error {
	if c.sleepOnFutex(want, dl, ready) {
		return nil
	}
	// Say so, then look again, so that a ring moved in between is not
	// slept through (ring.go says why raise is a swap).
	raise(want, wantBell)
	var err error
	if !ready() {
		err = wait(bell)
	}
	atomic.StoreUint32(want, 0)
	return err
}

// sleepOnFutex sleeps on want's futex until ready(), futexTime, the
// deadline or a close, and reports whether the caller should look
// again rather than go on to the doorbell: false when no futex sleep
// was free, the time ran out with nothing ready, or the connection was
// closed. The word stays wantFutex only while this side sleeps on it.
//
// A waker takes the word down before FUTEX_WAKE (wakeFutex), so that a
// wake-up that comes after the sleeper's last look and before its
// FUTEX_WAIT is not lost: the wait finds the word changed and returns
// at once. So each round puts the word up again before it looks.
func (c *conn) sleepOnFutex(want *uint32, dl *deadline, ready func() bool) bool {
	if futexSleepers.Add(1) > min(maxFutexSleepers, int32(runtime.GOMAXPROCS(0))-1) {
		futexSleepers.Add(-1)
		return false
	}
	defer futexSleepers.Add(-1)
	defer atomic.StoreUint32(want, 0)
	end := time.Now().Add(futexTime)
	for {
		raise(want, wantFutex)
		switch {
		case ready():
			return true
		case c.closed.Load():
			return false // the doorbell, closed, says so
		}
		left := time.Until(end)
		if t := dl.t.Load(); t != 0 {
			left = min(left, time.Until(time.Unix(0, t)))
		}
		if left <= 0 {
			return dl.exceeded()
		}
		// Woken, the word changed (EAGAIN), or the time is up: look
		// again. A peer that keeps changing the word (only one that
		// breaks the protocol does) keeps this side busy for futexTime
		// at most.
		futexWait(want, wantFutex, left)
	}
}

// futexWait sleeps while *addr holds val, for d at most, until a
// FUTEX_WAKE; it returns at once if *addr holds another value. The word
// is in memory another process maps: not a private futex.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opFutexWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes the sleepers on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), opFutexWake, 1<<30, 0, 0, 0)
}

// wakeFutex wakes a sleeper on want's futex, if one sleeps there: it
// takes the word down first (sleepOnFutex says why), and reports whether
// it found the word up.
func wakeFutex(want *uint32) bool {
	if !atomic.CompareAndSwapUint32(want, wantFutex, 0) {
		return false
	}
	futexWake(want)
	return true
}

// notify wakes the peer's sleeper on want, if it sleeps: by the futex
// or by its doorbell (bell, the peer's descriptor), as the word says.
// A word that changes under it (the sleeper moving from the futex to
// the doorbell) is read again.
func notify(want *uint32, bell int) {
	for range 3 {
		switch atomic.LoadUint32(want) {
		case 0:
			return
		case wantFutex:
			if wakeFutex(want) {
				return
			}
		default:
			ringFd(bell)
			return
		}
	}
	// Only a peer that breaks the protocol flips the word this fast.
	ringFd(bell)
}

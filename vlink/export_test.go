package vlink

import (
	"net"
	"time"
)

// RaceStagger is raceStagger, for the best-effort tests of package vlink_test.
const RaceStagger = raceStagger

// SetWaitBeyond sets the wait beyond which a hello names the dialer's
// (waitBeyond) until the test ends.
func SetWaitBeyond(t interface{ Cleanup(func()) }, d time.Duration) {
	old := waitBeyond
	waitBeyond = d
	t.Cleanup(func() { waitBeyond = old })
}

// Backdate makes l's start d earlier, as if it had been up that long:
// it takes early data only in first flights dated after its start plus
// the replay window.
func Backdate(l interface{ Addr() net.Addr }, d time.Duration) {
	r := l.(*Listener).replay
	r.started = r.started.Add(-d)
}

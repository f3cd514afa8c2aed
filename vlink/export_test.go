package vlink

import "time"

// RaceStagger is raceStagger, for the best-effort tests of package vlink_test.
const RaceStagger = raceStagger

// SetWaitBeyond sets the wait beyond which a hello names the dialer's
// (waitBeyond) until the test ends.
func SetWaitBeyond(t interface{ Cleanup(func()) }, d time.Duration) {
	old := waitBeyond
	waitBeyond = d
	t.Cleanup(func() { waitBeyond = old })
}

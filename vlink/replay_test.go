package vlink

import (
	"fmt"
	"testing"
	"time"
)

// TestReplayRecord: a first flight is taken once within its window, and
// no more once it has been seen, or when it is dated outside the window,
// or when the record is full; a mark is kept at least as long as its
// time could pass.
func TestReplayRecord(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	ms := func(t time.Time) uint64 { return uint64(t.UnixMilli()) }
	mark := func(i int) []byte { return fmt.Appendf(nil, "mark %11d", i) }
	w := firstFlightWindow

	r := newReplayRecord(start)
	now := start.Add(time.Minute)
	for _, tc := range []struct {
		name string
		mark []byte
		sent time.Time
		at   time.Time
		want bool
	}{
		{"fresh", mark(1), now, now, true},
		{"the same again", mark(1), now, now, false},
		{"another", mark(2), now.Add(-w), now, true},
		{"older than the window", mark(3), now.Add(-w - time.Millisecond), now, false},
		{"from further than the window ahead", mark(4), now.Add(w + time.Millisecond), now, false},
		{"from the window ahead", mark(5), now.Add(w), now, true},
		// Still dated within the window at its last moment, so still known.
		{"the one from ahead, at the end of its window", mark(5), now.Add(w), now.Add(2 * w), false},
		{"the first, a generation later", mark(1), now, now.Add(2*w + time.Second), false},
		{"a new one, a generation later", mark(6), now.Add(2*w + time.Second), now.Add(2*w + time.Second), true},
	} {
		if got := r.fresh(tc.mark, ms(tc.sent), tc.at); got != tc.want {
			t.Errorf("%s: fresh = %v, want %v", tc.name, got, tc.want)
		}
	}

	// Long after, the record holds nothing, and a record that is full
	// takes nothing more.
	later := now.Add(10 * w)
	r.max = 2
	for i, want := range []bool{true, true, false} {
		if got := r.fresh(mark(100+i), ms(later), later); got != want {
			t.Errorf("full record: flight %d: fresh = %v, want %v", i, got, want)
		}
	}
	if n := len(r.cur) + len(r.prev); n != 2 {
		t.Errorf("the record holds %d marks, want 2", n)
	}
}

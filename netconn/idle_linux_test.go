package netconn

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestWatchIdle: a connection that carries nothing for the idle time is
// reset (its peer reads ECONNRESET); one that carries a byte now and then
// is left alone, whichever way the bytes go.
//
// The contract is about the bytes, not about the test's intentions: a
// writer the machine stalls for the idle time leaves the connection idle,
// and the watch is right to abort it. So the test times every write and
// fails on an abort only when no gap between bytes (as the watch counts
// them) reached the idle time; otherwise it says so and shows nothing.
func TestWatchIdle(t *testing.T) {
	const (
		idle  = 500 * time.Millisecond
		every = idle / 20
		// ackDelay bounds how long the kernel holds an ACK back
		// (TCP_DELACK_MAX; on loopback its bound is 40 ms): the watch
		// counts a byte sent when the peer acknowledges it.
		ackDelay = 200 * time.Millisecond
	)
	for _, tc := range []struct {
		name   string
		active bool
		up     bool // the watched side sends (else it receives)
	}{
		{"silent", false, false},
		{"sending", true, true},
		{"receiving", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			defer a.Close()
			defer b.Close()
			start := time.Now()
			w := WatchIdle(idle, a, a)
			if w == nil {
				t.Fatal("no watch on a TCP connection")
			}
			if !tc.active {
				b.SetReadDeadline(time.Now().Add(20 * idle))
				_, err := b.Read(make([]byte, 1))
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("peer of an idle connection read %v, want a reset", err)
				}
				if !w.Stop() {
					t.Error("Stop does not report the abort")
				}
				return
			}
			from, to := b, a
			lag := time.Duration(0) // from a write to when the watch can count it
			if tc.up {
				from, to, lag = a, b, ackDelay
			}
			copied := make(chan struct{})
			go func() { io.Copy(io.Discard, to); close(copied) }()
			defer func() { a.Close(); b.Close(); <-copied }()
			// gap is the longest time the watch may have seen without a
			// byte: from one write's start to the next one's end.
			var gap time.Duration
			var werr error
			last := start
			for end := start.Add(3 * idle); time.Now().Before(end); time.Sleep(every) {
				before := time.Now()
				if _, werr = from.Write([]byte{1}); werr != nil {
					break
				}
				gap = max(gap, time.Since(last)+lag)
				last = before
			}
			fired := w.Stop()
			gap = max(gap, time.Since(last)+lag)
			switch {
			case !fired && werr != nil:
				t.Fatalf("write while active: %v", werr)
			case fired && gap < idle:
				t.Fatalf("an active connection was aborted (write: %v): its bytes were never more than %v apart, idle is %v", werr, gap.Round(time.Millisecond), idle)
			case fired:
				t.Logf("aborted after %v without a byte (the machine stalled the writer): the watch was right, and this run shows nothing about active connections", gap.Round(time.Millisecond))
			}
		})
	}
}

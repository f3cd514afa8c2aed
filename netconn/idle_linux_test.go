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
func TestWatchIdle(t *testing.T) {
	const idle = 200 * time.Millisecond
	for _, tc := range []struct {
		name  string
		every time.Duration // 0: silent
		up    bool          // the watched side sends (else it receives)
	}{
		{"silent", 0, false},
		{"sending", idle / 4, true},
		{"receiving", idle / 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			defer a.Close()
			defer b.Close()
			w := WatchIdle(idle, a, a)
			if w == nil {
				t.Fatal("no watch on a TCP connection")
			}
			if tc.every > 0 {
				from, to := b, a
				if tc.up {
					from, to = a, b
				}
				copied := make(chan struct{})
				go func() { io.Copy(io.Discard, to); close(copied) }()
				defer func() { a.Close(); b.Close(); <-copied }()
				for range int(5 * idle / tc.every) {
					if _, err := from.Write([]byte{1}); err != nil {
						t.Fatalf("write while active: %v", err)
					}
					time.Sleep(tc.every)
				}
				if w.Stop() {
					t.Fatal("an active connection was aborted")
				}
				return
			}
			b.SetReadDeadline(time.Now().Add(20 * idle))
			_, err := b.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("peer of an idle connection read %v, want a reset", err)
			}
			if !w.Stop() {
				t.Error("Stop does not report the abort")
			}
		})
	}
}

package forward

import (
	"testing"
	"time"
)

// TestRunWaitedThenRefused: a handler started with Run, on a goroutine
// of the caller's, is waited for by shutdown, and once shutdown has
// begun Run starts none.
func TestRunWaitedThenRefused(t *testing.T) {
	tr := NewTracker(nil)
	started, release := make(chan struct{}), make(chan struct{})
	ran := make(chan bool, 1)
	go func() {
		ran <- tr.Run(func() {
			close(started)
			<-release
		})
	}()
	<-started
	cut := make(chan int, 1)
	go func() { cut <- tr.shutdown(time.Hour) }()
	select {
	case <-cut:
		t.Fatal("shutdown did not wait for the handler Run started")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if !<-ran {
		t.Error("Run = false for a handler it ran")
	}
	<-cut
	if tr.Run(func() { t.Error("Run started a handler after shutdown") }) {
		t.Error("Run = true after shutdown")
	}
}

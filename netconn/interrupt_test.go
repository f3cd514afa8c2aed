package netconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestInterrupt(t *testing.T) {
	for _, tt := range []struct {
		name      string
		interrupt func(context.CancelFunc, net.Conn)
	}{
		{"Interrupt", func(_ context.CancelFunc, c net.Conn) { Interrupt(c) }},
		{"InterruptRead", func(_ context.CancelFunc, c net.Conn) { InterruptRead(c) }},
		{"InterruptOnDone", func(cancel context.CancelFunc, _ net.Conn) { cancel() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := InterruptOnDone(ctx, a)
			defer stop()
			if tt.name != "InterruptOnDone" {
				stop()
			}
			errc := make(chan error, 1)
			go func() { _, err := a.Read(make([]byte, 1)); errc <- err }()
			time.Sleep(10 * time.Millisecond) // let the read block
			tt.interrupt(cancel, a)
			if tt.name == "InterruptRead" {
				// Writes still go through.
				go b.Read(make([]byte, 1))
				if _, err := a.Write([]byte{1}); err != nil {
					t.Fatalf("write after InterruptRead: %v", err)
				}
			}
			select {
			case err := <-errc:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("blocked read returned %v, want os.ErrDeadlineExceeded", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("blocked read not interrupted")
			}
			// The connection is not closed: a cleared deadline reads again.
			a.SetDeadline(time.Time{})
			go b.Write([]byte{7})
			if _, err := a.Read(make([]byte, 1)); err != nil {
				t.Fatalf("read after clearing the deadline: %v", err)
			}
		})
	}
}

type tempErr struct{}

func (tempErr) Error() string   { return "too many open files" }
func (tempErr) Timeout() bool   { return false }
func (tempErr) Temporary() bool { return true }

func TestAcceptBackoff(t *testing.T) {
	t.Run("temporary errors wait longer each time", func(t *testing.T) {
		var b AcceptBackoff
		for _, want := range []time.Duration{5, 10, 20, 40} {
			want *= time.Millisecond
			start := time.Now()
			if !b.Wait(&net.OpError{Op: "accept", Err: tempErr{}}, nil) {
				t.Fatal("Wait gave up on a temporary error")
			}
			if b.delay != want || time.Since(start) < want {
				t.Fatalf("waited %v with delay %v, want a delay of %v", time.Since(start), b.delay, want)
			}
		}
		b.Reset()
		b.Wait(tempErr{}, nil)
		if b.delay != 5*time.Millisecond {
			t.Fatalf("first delay after Reset = %v, want 5ms", b.delay)
		}
	})
	t.Run("the delay stops at a second", func(t *testing.T) {
		b := AcceptBackoff{delay: 800 * time.Millisecond}
		done := make(chan struct{})
		time.AfterFunc(50*time.Millisecond, func() { close(done) })
		if b.Wait(tempErr{}, done) {
			t.Fatal("Wait reported true after done was closed")
		}
		if b.delay != time.Second {
			t.Fatalf("delay after 800ms = %v, want 1s", b.delay)
		}
	})
	for _, err := range []error{
		net.ErrClosed,
		fmt.Errorf("accept: %w", net.ErrClosed),
		errors.New("some failure"),
		&net.OpError{Op: "accept", Err: syscall.EINVAL},
	} {
		t.Run(fmt.Sprintf("gives up on %v", err), func(t *testing.T) {
			var b AcceptBackoff
			if b.Wait(err, nil) || b.delay != 0 {
				t.Fatalf("Wait(%v) = true or waited %v, want false at once", err, b.delay)
			}
		})
	}
}

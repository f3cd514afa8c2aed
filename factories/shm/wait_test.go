//go:build linux

package shm

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestSleepAndWake: a side that sleeps for data or for room is woken
// by what it waits for, and by what ends its wait (a close, a deadline,
// the peer's end or abort), however it sleeps: on the futex (held far
// longer than the test, so only a wake-up ends that sleep), on the
// doorbell after its futex time, or on the doorbell at once when no
// futex sleep is free. Polling is off, so every wait sleeps.
func TestSleepAndWake(t *testing.T) {
	ways := []struct {
		name       string
		futexTime  time.Duration
		maxSleeper int32
	}{
		{"futex", time.Hour, 16},
		{"futex then doorbell", time.Millisecond, 16},
		{"doorbell, no futex free", time.Hour, 0},
	}
	events := []struct {
		name string
		// do acts on the sleeper's side a and its peer b while a sleeps
		// in wait; check judges wait's error.
		do    func(a, b net.Conn)
		wait  func(a net.Conn) error
		check func(error) bool
	}{
		{"data arrives",
			func(a, b net.Conn) { b.Write([]byte("x")) },
			func(a net.Conn) error { return readOne(a, 'x') },
			func(err error) bool { return err == nil }},
		{"room frees",
			func(a, b net.Conn) { io.CopyN(io.Discard, b, minRingSize) },
			func(a net.Conn) error {
				_, err := a.Write(make([]byte, 2*minRingSize))
				return err
			},
			func(err error) bool { return err == nil }},
		{"the peer's end",
			func(a, b net.Conn) { b.(*conn).CloseWrite() },
			func(a net.Conn) error { _, err := a.Read(make([]byte, 1)); return err },
			func(err error) bool { return err == io.EOF }},
		{"the peer's abort",
			func(a, b net.Conn) { b.(*conn).Abort() },
			func(a net.Conn) error { _, err := a.Read(make([]byte, 1)); return err },
			func(err error) bool { return errors.Is(err, ErrReset) }},
		{"a close",
			func(a, b net.Conn) { a.Close() },
			func(a net.Conn) error { _, err := a.Read(make([]byte, 1)); return err },
			func(err error) bool { return errors.Is(err, net.ErrClosed) }},
		{"a read deadline",
			func(a, b net.Conn) { a.SetReadDeadline(time.Now()) },
			func(a net.Conn) error { _, err := a.Read(make([]byte, 1)); return err },
			func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
		{"a write deadline",
			func(a, b net.Conn) { a.SetWriteDeadline(time.Now()) },
			func(a net.Conn) error {
				_, err := a.Write(make([]byte, 2*minRingSize))
				return err
			},
			func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
	}
	defer func(s, f time.Duration, m int32) { spinTime, futexTime, maxFutexSleepers = s, f, m }(spinTime, futexTime, maxFutexSleepers)
	spinTime = 0
	for _, w := range ways {
		futexTime, maxFutexSleepers = w.futexTime, w.maxSleeper
		for _, e := range events {
			t.Run(w.name+"/"+e.name, func(t *testing.T) {
				a, b := pair(t, minRingSize)
				defer a.Close()
				defer b.Close()
				done := make(chan error, 1)
				go func() { done <- e.wait(a) }()
				// Long enough for the sleeper to be asleep, past a futex
				// time of a millisecond.
				time.Sleep(20 * time.Millisecond)
				select {
				case err := <-done:
					t.Fatalf("did not sleep: %v", err)
				default:
				}
				e.do(a, b)
				select {
				case err := <-done:
					if !e.check(err) {
						t.Fatalf("woke with %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("still asleep 5 s after what it waits for")
				}
			})
		}
	}
}

func readOne(c net.Conn, want byte) error {
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if !bytes.Equal(b, []byte{want}) {
		return errors.New("read the wrong byte")
	}
	return nil
}

// TestNoLostFutexWake: a wake-up that comes between the sleeper's last
// look at the ring and its FUTEX_WAIT is not lost. With polling off and
// the futex held for an hour, one lost wake-up stalls the ping-pong.
func TestNoLostFutexWake(t *testing.T) {
	defer func(s, f time.Duration) { spinTime, futexTime = s, f }(spinTime, futexTime)
	spinTime, futexTime = 0, time.Hour
	a, b := pair(t, minRingSize)
	defer a.Close()
	defer b.Close()
	go io.Copy(b, b)
	const rounds = 20000
	done := make(chan error, 1)
	go func() {
		one := []byte{1}
		for range rounds {
			if _, err := a.Write(one); err != nil {
				done <- err
				return
			}
			if _, err := io.ReadFull(a, one); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%d round trips stalled: a wake-up was lost", rounds)
	}
}

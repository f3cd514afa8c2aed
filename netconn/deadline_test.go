package netconn

import (
	"sync"
	"testing"
	"time"
)

func TestDeadline(t *testing.T) {
	fired := func(d *Deadline) bool {
		select {
		case <-d.Done():
			return true
		default:
			return false
		}
	}
	t.Run("zero value has none", func(t *testing.T) {
		var d Deadline
		if fired(&d) || d.Exceeded() {
			t.Fatal("zero Deadline has expired")
		}
	})
	t.Run("past expires at once", func(t *testing.T) {
		var d Deadline
		d.Set(time.Now().Add(-time.Second))
		if !fired(&d) || !d.Exceeded() {
			t.Fatal("past deadline has not expired")
		}
		d.Set(time.Now().Add(-time.Second)) // again: no double close
		if !d.Exceeded() {
			t.Fatal("past deadline set twice has not expired")
		}
	})
	t.Run("future fires a blocked wait", func(t *testing.T) {
		var d Deadline
		done := d.Done() // taken before Set: a blocked wait sees the change
		d.Set(time.Now().Add(20 * time.Millisecond))
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("deadline did not fire")
		}
	})
	t.Run("clear after expiry", func(t *testing.T) {
		var d Deadline
		d.Set(time.Now())
		d.Set(time.Time{})
		if fired(&d) || d.Exceeded() {
			t.Fatal("cleared deadline still expired")
		}
	})
	t.Run("extend before expiry", func(t *testing.T) {
		var d Deadline
		d.Set(time.Now().Add(10 * time.Millisecond))
		d.Set(time.Now().Add(time.Hour))
		time.Sleep(30 * time.Millisecond)
		if fired(&d) {
			t.Fatal("extended deadline fired at the old time")
		}
		d.Set(time.Time{})
	})
	t.Run("concurrent", func(t *testing.T) {
		var d Deadline
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 200 {
					// Others may clear or extend it at any moment, so
					// only the absence of races and deadlocks is checked.
					d.Set(time.Now().Add(time.Duration((i+j)%3) * time.Microsecond))
					select {
					case <-d.Done():
					case <-time.After(time.Millisecond):
					}
					d.Exceeded()
					d.Set(time.Time{})
				}
			}()
		}
		wg.Wait()
	})
}

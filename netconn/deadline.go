package netconn

import (
	"sync"
	"time"
)

// A Deadline is a read or write deadline for a connection whose I/O blocks
// in user space (on a channel or a condition, not in the kernel), after
// the helper behind net.Pipe. Set arms it; Done returns a channel closed
// once the deadline has passed, which a blocked operation selects on
// together with its own progress, so a deadline set while an operation is
// blocked applies to that operation. An operation that gives up on it
// returns os.ErrDeadlineExceeded, as the net package's connections do.
//
// The zero value has no deadline and is ready to use. A Deadline is safe
// for concurrent use.
type Deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes; nil until needed
}

// Set sets the deadline: the zero time clears it, a time in the past
// expires it at once.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait for it to close cancel
	}
	d.timer = nil
	closed := d.cancel != nil && isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed || d.cancel == nil {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if d.cancel == nil {
		d.cancel = make(chan struct{})
	}
	if !closed {
		close(d.cancel)
	}
}

// Done returns a channel that is closed when the deadline passes. The
// channel changes when the deadline is set again, so take it for each
// wait rather than once per connection.
func (d *Deadline) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel == nil {
		d.cancel = make(chan struct{})
	}
	return d.cancel
}

// Exceeded reports whether the deadline has passed.
func (d *Deadline) Exceeded() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel != nil && isClosed(d.cancel)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

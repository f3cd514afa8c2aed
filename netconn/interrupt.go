package netconn

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// aLongTimeAgo is a deadline already gone by: setting it wakes blocked I/O
// with os.ErrDeadlineExceeded without closing anything.
var aLongTimeAgo = time.Unix(1, 0)

// Interrupt makes c's blocked and later reads and writes fail at once
// with os.ErrDeadlineExceeded, without closing c; a new deadline undoes it.
func Interrupt(c interface{ SetDeadline(time.Time) error }) error {
	return c.SetDeadline(aLongTimeAgo)
}

// InterruptRead is Interrupt for reads only, so what is being written
// still goes out.
func InterruptRead(c interface{ SetReadDeadline(time.Time) error }) error {
	return c.SetReadDeadline(aLongTimeAgo)
}

// InterruptOnDone interrupts c's I/O when ctx is done, which is how a
// context bounds a handshake on a connection whose calls take no context.
// stop is context.AfterFunc's: it reports false if the interrupt already
// ran.
func InterruptOnDone(ctx context.Context, c net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { Interrupt(c) })
}

// An AcceptBackoff paces an accept loop through temporary failures (out
// of descriptors, a connection aborted before it was accepted) as
// net/http's Server does: 5 ms after the first, doubling up to 1 s, and
// none again after an Accept succeeds. The zero value is ready to use.
type AcceptBackoff struct {
	// Log, if set, hears of each wait.
	Log   *slog.Logger
	delay time.Duration
}

// Wait reports whether to call Accept again after it failed with err. For
// a temporary failure it waits the next delay and reports true, unless
// done is closed first; any other error reports false at once.
func (b *AcceptBackoff) Wait(err error, done <-chan struct{}) bool {
	if !isTemporary(err) {
		return false
	}
	b.delay = min(max(2*b.delay, 5*time.Millisecond), time.Second)
	if b.Log != nil {
		b.Log.Warn("accept", "err", err, "retry_in", b.delay)
	}
	t := time.NewTimer(b.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// Reset starts the delays over, after an Accept that succeeded.
func (b *AcceptBackoff) Reset() { b.delay = 0 }

func isTemporary(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

package netconn

import (
	"net"
	"sync"
	"time"
)

// An IdleWatch aborts connections that carried no byte for a while. It
// reads the traffic from the kernel (the TCP connection's counters of
// bytes received and acknowledged) with a timer, so it costs nothing on
// the data path, works whatever copies the bytes (the kernel's zero-copy
// path, splice(2), included), and an idle connection holds no goroutine.
type IdleWatch struct {
	idle    time.Duration
	count   func() (uint64, bool)
	conns   []net.Conn
	mu      sync.Mutex
	timer   *time.Timer
	last    uint64
	since   time.Time
	stopped bool
	fired   bool
}

// WatchIdle aborts conns (see [Abort]) once idle has passed without a
// byte received or acknowledged on watch, whose bottom connection (under
// its [Unwrapper]s) must be TCP on Linux; it checks every idle/4. It
// returns nil when watch's traffic cannot be read: then nothing is
// watched.
func WatchIdle(idle time.Duration, watch net.Conn, conns ...net.Conn) *IdleWatch {
	if idle <= 0 {
		return nil
	}
	count := tcpBytes(watch)
	if count == nil {
		return nil
	}
	n, _ := count()
	w := &IdleWatch{idle: idle, count: count, conns: conns, last: n, since: time.Now()}
	// check takes mu first: it must not run before timer is set.
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = time.AfterFunc(w.period(), w.check)
	return w
}

func (w *IdleWatch) period() time.Duration { return max(w.idle/4, time.Millisecond) }

func (w *IdleWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	n, ok := w.count()
	now := time.Now()
	switch {
	case !ok:
		return // the socket is closed: the relay is ending
	case n != w.last:
		w.last, w.since = n, now
	case now.Sub(w.since) >= w.idle:
		w.fired, w.stopped = true, true
		for _, c := range w.conns {
			Abort(c)
		}
		return
	}
	w.timer.Reset(w.period())
}

// Stop stops watching and reports whether the watch had aborted the
// connections. It may be called on a nil *IdleWatch.
func (w *IdleWatch) Stop() (fired bool) {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
	return w.fired
}

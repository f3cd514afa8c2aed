package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
)

// A Tracker follows the connections a server relays, so that shutdown can
// let them finish for a grace period and then cut them.
type Tracker struct {
	wg      sync.WaitGroup   // one per connection handler
	Metrics *metrics.Metrics // nil: none

	// Ctx is cancelled when the connections are cut, to abort the dials
	// still in progress.
	Ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	cut   bool
	// stopping is set once shutdown waits for the handlers: Run starts
	// none after it.
	stopping bool
	live     map[*liveRelay]struct{} // the relays in progress
	total    totals
	// ended is the application bytes of the relays that ended, by
	// their labels, up and down: with the live ones', the metrics' bytes.
	ended map[metrics.Labels]*[2]uint64
}

func NewTracker(m *metrics.Metrics) *Tracker {
	t := &Tracker{conns: map[net.Conn]struct{}{}, Metrics: m, ended: map[metrics.Labels]*[2]uint64{}}
	t.Ctx, t.cancel = context.WithCancel(context.Background())
	m.AddBytes(t.bytes)
	return t
}

// bytes is the tracker's metrics.ByteSource: the ended relays' bytes,
// and the kernel's counts of those in progress, sampled now.
func (t *Tracker) bytes(yield func(l metrics.Labels, up, down uint64)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for l, v := range t.ended {
		yield(l, v[0], v[1])
	}
	for r := range t.live {
		r.sample()
		yield(r.labels, r.seenUp, r.seenDown)
	}
}

// AcceptLoop passes every connection l accepts to accept, which spawns
// its handler, until l fails or ctx ends (closing l). A temporary failure
// (out of descriptors) is retried with backoff, as net/http does. Then l
// is closed; on ctx's end the open connections get grace to finish before
// they are cut, on a failure they are cut at once and it is returned.
func (t *Tracker) AcceptLoop(ctx context.Context, log *slog.Logger, l net.Listener, grace time.Duration, accept func(net.Conn)) error {
	stopOnCancel := context.AfterFunc(ctx, func() { l.Close() })
	defer stopOnCancel()
	backoff := netconn.AcceptBackoff{Log: log}
	var acceptErr error
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil && backoff.Wait(err, ctx.Done()) {
				continue
			}
			acceptErr = err
			break
		}
		backoff.Reset()
		accept(c)
	}
	l.Close()
	if ctx.Err() == nil {
		t.shutdown(0)
		return fmt.Errorf("accepting: %w", acceptErr)
	}
	log.Info("shutting down", "active", t.active(), "grace", grace)
	if n := t.shutdown(grace); n > 0 {
		log.Info("closed connections still open after the grace period", "count", n)
	}
	return nil
}

// Spawn runs a connection handler that shutdown waits for.
func (t *Tracker) Spawn(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// Run runs a connection handler that shutdown waits for on the caller's
// goroutine, which need not be AcceptLoop's (a vlink.Listener's Handle).
// Once shutdown has begun it returns false at once: the caller closes
// the connection.
func (t *Tracker) Run(f func()) bool {
	t.mu.Lock()
	if t.stopping {
		t.mu.Unlock()
		return false
	}
	t.wg.Add(1) // before shutdown's Wait: it sets stopping first
	t.mu.Unlock()
	defer t.wg.Done()
	f()
	return true
}

// Add registers connections being relayed. Once the connections have been
// cut it aborts them instead and returns false.
func (t *Tracker) Add(cs ...net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		for _, c := range cs {
			netconn.Abort(c)
		}
		return false
	}
	for _, c := range cs {
		t.conns[c] = struct{}{}
	}
	return true
}

func (t *Tracker) Remove(cs ...net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cs {
		delete(t.conns, c)
	}
}

// shutdown waits up to grace for the handlers to finish, then closes the
// connections still open and waits for their handlers to return. It
// reports how many relays it cut. The caller has stopped accepting
// already.
func (t *Tracker) shutdown(grace time.Duration) (cut int) {
	t.mu.Lock()
	t.stopping = true
	t.mu.Unlock()
	done := make(chan struct{})
	go func() {
		t.wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.mu.Lock()
		cut = len(t.live)
		t.mu.Unlock()
		t.closeAll()
		<-done
	}
	// Connections no handler took (a target dialed for a handshake that
	// never completed) are closed too.
	t.closeAll()
	return cut
}

// closeAll aborts every tracked connection (a reset, so that neither
// end takes a cut stream for a complete one) and the dials in progress,
// and makes add refuse new connections.
func (t *Tracker) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cut = true
	for c := range t.conns {
		netconn.Abort(c)
		delete(t.conns, c)
	}
	t.cancel()
}

// active reports how many relays are in progress.
func (t *Tracker) active() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live)
}

// Relay joins the client's connection a and the target's b, counted
// in the metrics under l, until both directions end, and logs the
// outcome: at debug when all went well, at info when the Relay failed.
func (t *Tracker) Relay(log *slog.Logger, l metrics.Labels, a, b net.Conn, attrs ...any) {
	t.RelayIdle(log, 0, l, a, b, attrs...)
}

// RelayIdle is relay resetting both connections once a's carried no byte
// for idle (0: never).
func (t *Tracker) RelayIdle(log *slog.Logger, idle time.Duration, l metrics.Labels, a, b net.Conn, attrs ...any) {
	if !t.Add(a, b) {
		return
	}
	t.Metrics.RelayStarted(l)
	live := newLiveRelay(l, a, b, attrs)
	t.liveStart(live)
	start := time.Now()
	w := netconn.WatchIdle(idle, a, a, b)
	up, down, err := netconn.Relay(a, b)
	idled := w.Stop()
	attrs = append(attrs, "bytes_up", up, "bytes_down", down, "took", time.Since(start).Round(time.Millisecond))
	t.mu.Lock()
	delete(t.conns, a)
	delete(t.conns, b)
	cut := t.cut
	t.mu.Unlock()
	t.liveEnd(live, up, down, cut || idled || err != nil)
	switch {
	case cut:
		t.Metrics.RelayEnded(l, metrics.OutcomeCut)
		log.Debug("connection cut at shutdown", attrs...)
	case idled:
		t.Metrics.RelayEnded(l, metrics.OutcomeIdle)
		log.Info("connection reset: idle", append(attrs, "idle_timeout", idle)...)
	case err != nil:
		t.Metrics.RelayEnded(l, metrics.OutcomeFailed)
		log.Info("connection failed", append(attrs, "err", err)...)
	default:
		t.Metrics.RelayEnded(l, metrics.OutcomeOK)
		log.Debug("connection closed", attrs...)
	}
}

// RelayDatagrams joins a and b, each carrying whole datagrams (a UDP
// socket, a dgram.Conn, a dgram.Session), until one ends or fails, or no
// datagram crossed either way for idle (0: never), then closes both and
// logs the outcome as Relay does. A failure resets both, so a stream
// below either end reports it.
func (t *Tracker) RelayDatagrams(log *slog.Logger, idle time.Duration, l metrics.Labels, a, b net.Conn, attrs ...any) {
	if !t.Add(a, b) {
		return
	}
	t.Metrics.RelayStarted(l)
	// In --stats as a relay in progress; its bytes count when it ends
	// (no socket of its own counts them as they cross).
	live := newLiveRelay(l, a, b, attrs)
	live.app, live.wire = nil, nil
	t.liveStart(live)
	start := time.Now()
	up, down, err := dgram.Relay(a, b, idle)
	idled := errors.Is(err, dgram.ErrIdle)
	t.mu.Lock()
	delete(t.conns, a)
	delete(t.conns, b)
	cut := t.cut
	t.mu.Unlock()
	t.liveEnd(live, up.Bytes, down.Bytes, cut || err != nil && !idled)
	if err != nil && !idled || cut {
		netconn.Abort(a)
		netconn.Abort(b)
	} else {
		a.Close()
		b.Close()
	}
	attrs = append(attrs, "datagrams_up", up.Datagrams, "bytes_up", up.Bytes, "datagrams_down", down.Datagrams, "bytes_down", down.Bytes,
		"took", time.Since(start).Round(time.Millisecond))
	if n := up.Errors + down.Errors; n > 0 {
		attrs = append(attrs, "socket_errors", n)
	}
	switch {
	case cut:
		t.Metrics.RelayEnded(l, metrics.OutcomeCut)
		log.Debug("datagram session cut at shutdown", attrs...)
	case idled:
		// A NAT's mapping ends so: nothing went wrong.
		t.Metrics.RelayEnded(l, metrics.OutcomeIdle)
		log.Debug("datagram session ended: idle", append(attrs, "idle_timeout", idle)...)
	case err != nil:
		t.Metrics.RelayEnded(l, metrics.OutcomeFailed)
		log.Info("datagram session failed", append(attrs, "err", err)...)
	default:
		t.Metrics.RelayEnded(l, metrics.OutcomeOK)
		log.Debug("datagram session closed", attrs...)
	}
}

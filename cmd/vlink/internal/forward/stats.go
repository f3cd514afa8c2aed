package forward

import (
	"context"
	"flag"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/netconn"
)

// StatsVar defines --stats.
func StatsVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "stats", 0, "log a one-line summary every `DURATION` (connections, throughput each way, compression ratio), as iperf3's interval reports; SIGUSR1 logs a snapshot of every open connection at any time (default: none)")
}

// A liveRelay is a relay in progress, as the statistics see it: the
// kernel's counts of the socket that carries the application's bytes
// and of the one that carries the wire's, read without touching the data
// path, so a relay that splices keeps splicing.
type liveRelay struct {
	labels metrics.Labels
	start  time.Time
	attrs  []any
	// app and wire are the sockets counting the application's bytes and
	// the wire's; nil when a side has no TCP socket of its own (a mux
	// stream). appIsA: the application's side is the relay's a (the
	// tunnel's local client), else b (serve's target).
	app, wire *net.TCPConn
	appIsA    bool
	// carried, if not nil, counts the application's bytes instead of
	// app: an event loop's (evloop.Conn.Carried).
	carried func() (up, down int64)
	// seen is what the last sample counted, application bytes up and
	// down, and wire bytes when wire is known.
	seenUp, seenDown, seenWire uint64
}

// sample reads the kernel's counts into r.seen*.
func (r *liveRelay) sample() {
	if r.carried != nil {
		up, down := r.carried()
		r.seenUp, r.seenDown = max(r.seenUp, uint64(up)), max(r.seenDown, uint64(down))
		return
	}
	if r.app == nil {
		return
	}
	app, ok := netconn.ReadTCPCounts(r.app)
	if !ok {
		return
	}
	// The kernel counts the SYN and the FINs as bytes: left out, or a
	// sample would exceed the bytes the relay counts by the end, and a
	// counter go back. The target's socket is the one that was dialed.
	acked, received := app.Data(!r.appIsA)
	up, down := received, acked // from the client, back to it
	if !r.appIsA {
		up, down = acked, received // to the target, back from it
	}
	r.seenUp, r.seenDown = max(r.seenUp, up), max(r.seenDown, down)
	if r.wire != nil {
		if w, ok := netconn.ReadTCPCounts(r.wire); ok {
			r.seenWire = max(r.seenWire, w.Acked+w.Received)
		}
	}
}

// newLiveRelay finds the sockets of relay a <-> b: the side that is a
// TCP connection itself carries the application's bytes, the socket
// below the other side the wire's.
func newLiveRelay(l metrics.Labels, a, b net.Conn, attrs []any) *liveRelay {
	r := &liveRelay{labels: l, start: time.Now(), attrs: attrs}
	if ta, ok := a.(*net.TCPConn); ok {
		r.app, r.appIsA, r.wire = ta, true, netconn.TCPBelow(b)
	} else if tb, ok := b.(*net.TCPConn); ok {
		r.app, r.wire = tb, netconn.TCPBelow(a)
	}
	return r
}

// totals are the statistics' counters since the start, each kept so
// that an interval's figure is the difference of two totals.
type totals struct {
	opened, done, failed int64
	up, down             uint64 // application bytes
	// sampledApp and wire count the bytes of relays whose wire is known,
	// as sampled: the compression ratio is their quotient.
	sampledApp, wire uint64
}

// liveStart registers a relay in progress.
func (t *Tracker) liveStart(r *liveRelay) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live == nil {
		t.live = map[*liveRelay]struct{}{}
	}
	t.live[r] = struct{}{}
	t.total.opened++
}

// liveEnd folds a finished relay into the totals: its application bytes
// as the relay counted them, its wire bytes as last sampled.
func (t *Tracker) liveEnd(r *liveRelay, up, down int64, failed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.live, r)
	t.total.done++
	if failed {
		t.total.failed++
	}
	t.total.up += uint64(up)
	t.total.down += uint64(down)
	// What a scrape saw of it must not shrink: the kernel's counts and
	// the relay's own may differ by what the other side never took.
	e := t.ended[r.labels]
	if e == nil {
		e = new([2]uint64)
		t.ended[r.labels] = e
	}
	e[0] += max(uint64(up), r.seenUp)
	e[1] += max(uint64(down), r.seenDown)
	if r.wire != nil {
		t.total.sampledApp += r.seenUp + r.seenDown
		t.total.wire += r.seenWire
	}
}

// snapshot samples the open relays and returns the totals so far, open
// relays included.
func (t *Tracker) snapshot() (tot totals, open []*liveRelay) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tot = t.total
	for r := range t.live {
		r.sample()
		tot.up += r.seenUp
		tot.down += r.seenDown
		if r.wire != nil {
			tot.sampledApp += r.seenUp + r.seenDown
			tot.wire += r.seenWire
		}
		open = append(open, r)
	}
	return tot, open
}

// A statsSource is what the statistics report on: a tracker, or the
// trackers of a --forwards file's forwards.
type statsSource interface {
	// snapshot samples the open relays and returns the totals so far,
	// open relays included.
	snapshot() (totals, []*liveRelay)
}

// statsGroup sums the statistics of the forwards of a file, those still
// draining and those gone included.
type statsGroup struct {
	mu   sync.Mutex
	ts   map[*Tracker]struct{}
	gone totals
}

func (g *statsGroup) add(t *Tracker) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ts == nil {
		g.ts = map[*Tracker]struct{}{}
	}
	g.ts[t] = struct{}{}
}

// retire folds the totals of t, whose relays have all ended, into the
// group's.
func (g *statsGroup) retire(t *Tracker) {
	tot, _ := t.snapshot()
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.ts, t)
	g.gone.add(tot)
}

func (g *statsGroup) snapshot() (totals, []*liveRelay) {
	g.mu.Lock()
	defer g.mu.Unlock()
	tot := g.gone
	var open []*liveRelay
	for t := range g.ts {
		tt, o := t.snapshot()
		tot.add(tt)
		open = append(open, o...)
	}
	return tot, open
}

// add adds u's counts to t's.
func (t *totals) add(u totals) {
	t.opened += u.opened
	t.done += u.done
	t.failed += u.failed
	t.up += u.up
	t.down += u.down
	t.sampledApp += u.sampledApp
	t.wire += u.wire
}

// reportStats logs a summary of src every interval (0: never) and a
// snapshot on every value from snap, until ctx ends.
func reportStats(ctx context.Context, log *slog.Logger, interval time.Duration, src statsSource, snap <-chan os.Signal) {
	var tick <-chan time.Time
	if interval > 0 {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	start := time.Now()
	last, lastAt := totals{}, start
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick:
			tot, open := src.snapshot()
			log.Info("stats", statsAttrs(now.Sub(lastAt), len(open), tot, last)...)
			last, lastAt = tot, now
		case <-snap:
			tot, open := src.snapshot()
			log.Info("snapshot", statsAttrs(time.Since(start), len(open), tot, totals{})...)
			for _, r := range open {
				attrs := append([]any{}, r.attrs...)
				if !slices.Contains(attrs, any("stack")) { // serve's name it already
					attrs = append(attrs, "stack", r.labels.Stack)
				}
				attrs = append(attrs, "forward", r.labels.Forward, "transport", r.labels.Transport)
				log.Info("open connection", append(attrs, "age", time.Since(r.start).Round(time.Second),
					"bytes_up", r.seenUp, "bytes_down", r.seenDown)...)
			}
		}
	}
}

// statsAttrs describes what happened between totals from and to, over
// span: connections, throughput each way, compression ratio.
func statsAttrs(span time.Duration, open int, to, from totals) []any {
	sec := span.Seconds()
	rate := func(to, from uint64) string {
		if to < from || sec <= 0 {
			return base.FormatRate(0)
		}
		return base.FormatRate(float64(to-from) * 8 / sec)
	}
	diff := func(to, from uint64) uint64 { return to - min(to, from) }
	attrs := []any{"over", span.Round(time.Millisecond), "open", open, "new", to.opened - from.opened,
		"closed", to.done - from.done, "failed", to.failed - from.failed,
		"up", rate(to.up, from.up), "down", rate(to.down, from.down),
		"bytes_up", diff(to.up, from.up), "bytes_down", diff(to.down, from.down)}
	if wire := to.wire - from.wire; to.wire > from.wire && to.sampledApp > from.sampledApp {
		attrs = append(attrs, "ratio", math.Round(float64(to.sampledApp-from.sampledApp)/float64(wire)*100)/100)
	}
	return attrs
}

// StartStats runs reportStats on src for the command's life: with
// --stats every interval, and a snapshot on SIGUSR1 where there is one.
// The returned func stops it and waits for it.
func StartStats(log *slog.Logger, interval time.Duration, src statsSource) func() {
	snap := make(chan os.Signal, 1)
	notifySnapshot(snap)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		reportStats(ctx, log, interval, src, snap)
	}()
	return func() {
		stopSnapshot(snap)
		cancel()
		<-done
	}
}

// IgnoreHangup keeps SIGHUP, until the returned function runs, from
// ending a command that has no file to read again (started without
// --forwards): its default action would kill it, which a logrotate
// script or a kill -HUP habit does to a service by accident. Each one is
// logged, saying so.
func IgnoreHangup(log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	notifyReload(hup)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-hup:
				log.Info("SIGHUP ignored: started without --forwards, so there is no file to read again")
			case <-done:
				return
			}
		}
	}()
	return func() {
		stopReload(hup)
		close(done)
		<-ended
	}
}

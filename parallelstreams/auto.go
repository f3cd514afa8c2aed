package parallelstreams

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Auto mode. The dialer starts with two substreams and grows while it
// measures that more substreams deliver more, in either direction:
// goodput is what the applications have read, the credit the peer grants
// (its application's reads of ours) plus what ours has read of the
// peer's.
//
// After each growth the loop lets the new substreams ramp up for
// autoSettle (their dials are done by then; slow start over a long path
// is not), then measures goodput over autoWindow of active time: ticks
// in which the link, not the applications, set the pace, because our
// writer had more queued than the substreams took or the peer's bytes
// were arriving. Over a long path both stretch (paced). A window whose
// goodput beats the one before the growth by autoGain grows again:
// fourfold from the first two substreams, then twofold, so that 16 are
// two steps away. A window that does not is followed by another, and the
// two are judged together (a lost segment holds every substream's blocks
// for a round trip, which moves bytes from one window into the next),
// for autoPatience windows in all; then growth stops for good. It also
// stops at the layer's streams parameter, and when a dial fails.
//
// A window is compared with the whole measurement of the setting before,
// never with its best moment: after a stall, the blocks it held are read
// all at once, and a baseline taken from such a burst stops the growth a
// step early (as the first version of this loop did in 3 of 5 rounds on
// the lab's wan50 profile, docs/BENCHMARKS.md §4).
const (
	autoTick     = 100 * time.Millisecond
	autoSettle   = 300 * time.Millisecond
	autoWindow   = 500 * time.Millisecond
	autoGain     = 1.10 // at least 10% more goodput to count as better
	autoPatience = 2    // windows without gain before giving up
	autoFirst    = 4    // the first growth multiplies the substreams by this

	autoMaxSettle = 3 * time.Second
	autoMaxWindow = 6 * time.Second
)

type grower struct {
	s       *Session
	layer   *Layer
	network string
	address string
	lower   layer.Lower
	id      sessionID
	fake    *autoFake     // tests only; nil in production
	dialed  time.Duration // how long the session's first dials took

	received int64 // what our application had read at the last tick
}

// autoFake stands in, in tests, for the loop's ticker and what it
// measures, so that a test chooses each tick's readings and sees each
// decision without waiting for time to pass. Tests set Layer.autoFake;
// production leaves it nil and pays one nil check per tick.
type autoFake struct {
	tick    <-chan time.Time          // one tick per value
	measure func() (time.Time, int64) // replaces time.Now and the goodput at a tick
	now     func() time.Time          // replaces time.Now after a growth
	active  func() bool               // replaces the check of who set the pace
	done    chan<- struct{}           // closed when the loop returns
}

func (g *grower) run() {
	defer g.s.wg.Done()
	var tick <-chan time.Time
	if g.fake != nil {
		defer close(g.fake.done)
		tick = g.fake.tick
	} else {
		t := time.NewTicker(autoTick)
		defer t.Stop()
		tick = t.C
	}
	lastTime, last := g.measure()
	var (
		settle, window = paced(g.dialed)
		settled        = lastTime.Add(settle) // when the current configuration is measured from
		baseline       float64                // goodput per second of the configuration before
		spent          time.Duration          // active time measured in the current configuration
		bytes          int64                  // goodput in it
		windows        int                    // windows measured in it
	)
	for {
		select {
		case <-tick:
		case <-g.s.die:
			return
		case <-g.s.closing:
			return
		}
		now, c := g.measure()
		dt, db := now.Sub(lastTime), c-last
		last, lastTime = c, now
		// Ticks of ramp-up, and ticks the applications paced, are not
		// measured.
		if !now.After(settled) || !g.active() {
			continue
		}
		spent += dt
		bytes += db
		if spent < time.Duration(windows+1)*window {
			continue
		}
		windows++
		rate := float64(bytes) / spent.Seconds()
		if baseline > 0 && rate < baseline*autoGain {
			if windows >= autoPatience {
				return
			}
			continue
		}
		n := g.s.Streams()
		if n >= g.layer.Streams {
			return
		}
		next := 2 * n
		if baseline == 0 {
			next = autoFirst * n
		}
		start := g.now()
		if !g.grow(min(next, g.layer.Streams)-n) || g.s.Streams() >= g.layer.Streams {
			return
		}
		// Settle from after the dials, which take round trips.
		now = g.now()
		settle, window = paced(now.Sub(start))
		baseline, spent, bytes, windows = rate, 0, 0, 0
		settled = now.Add(settle)
	}
}

// paced returns how long new substreams ramp up and how long a window
// lasts, after dials that took dial. A dial is two or three round trips
// (TCP's handshake, the hello's), and slow start needs a few more, so
// over a path longer than about 50 ms both stretch beyond their floors,
// up to a bound that a dial slowed by retransmissions cannot pass.
func paced(dial time.Duration) (settle, window time.Duration) {
	return min(max(autoSettle, 2*dial), autoMaxSettle), min(max(autoWindow, 4*dial), autoMaxWindow)
}

// now is the time, which the dials of a growth have moved past the tick.
func (g *grower) now() time.Time {
	if g.fake != nil {
		return g.fake.now()
	}
	return time.Now()
}

// measure returns the time and the goodput so far: the credit the peer
// has granted, which grows with what its application reads, plus what
// our application has read.
func (g *grower) measure() (time.Time, int64) {
	if g.fake != nil {
		return g.fake.measure()
	}
	now := time.Now()
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return now, g.s.credit + g.s.consumed
}

// active reports whether the link set the pace since the last tick: data
// waits for a substream right now, or the peer's data arrived and was
// read.
func (g *grower) active() bool {
	if g.fake != nil {
		return g.fake.active()
	}
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	received := g.s.consumed
	moved := received != g.received
	g.received = received
	return len(g.s.queue) > 0 || moved
}

// grow adds k substreams, dialed at once: one after the other, the dials
// of 8 substreams over a 50 ms path took longer than a measurement. It
// reports whether all k joined. A failed dial only stops the growth: the
// session goes on with what it has.
func (g *grower) grow(k int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), layer.DefaultHandshakeTimeout)
	defer cancel()
	go func() {
		select {
		case <-g.s.die:
			cancel()
		case <-ctx.Done():
		}
	}()
	n := g.s.Streams()
	var (
		wg     sync.WaitGroup
		joined atomic.Int32
	)
	for i := range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := g.layer.dialSubstream(ctx, g.network, g.address, g.lower,
				join{index: n + i, count: g.layer.initial(), max: g.layer.Streams, id: g.id})
			if err != nil {
				return
			}
			if !g.s.add(c) {
				c.Close()
				return
			}
			joined.Add(1)
		}()
	}
	wg.Wait()
	return int(joined.Load()) == k
}

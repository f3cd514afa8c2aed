package parallelstreams

import (
	"context"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Auto mode. The dialer starts with two substreams and doubles them while
// it measures that more substreams deliver more: each round it compares
// the goodput (bytes the peer's application has read, as its credit
// reports) of the last interval with the best seen, counting only
// intervals in which the writer had more to send than the substreams took
// (otherwise the application, not the link, sets the pace). It stops
// growing at the layer's streams parameter, or after growth stopped
// paying twice.
const (
	autoInterval = 500 * time.Millisecond
	autoGain     = 1.10 // at least 10% more goodput to count as better
	autoPatience = 2    // rounds without gain before giving up
	autoSettle   = 2    // intervals to let new substreams ramp up
)

type grower struct {
	s       *Session
	layer   *Layer
	network string
	address string
	lower   layer.Lower
	id      sessionID
	fake    *autoFake // tests only; nil in production
}

// autoFake stands in, in tests, for the loop's ticker and what it
// measures, so that a test chooses each round's readings and sees each
// decision without waiting for time to pass. Tests set Layer.autoFake;
// production leaves it nil and pays one nil check per round.
type autoFake struct {
	tick       <-chan time.Time          // one round per value
	measure    func() (time.Time, int64) // replaces time.Now and the credit
	backlogged func() bool               // replaces the queue check
	done       chan<- struct{}           // closed when the loop returns
}

func (g *grower) run() {
	defer g.s.wg.Done()
	var tick <-chan time.Time
	if g.fake != nil {
		defer close(g.fake.done)
		tick = g.fake.tick
	} else {
		t := time.NewTicker(autoInterval)
		defer t.Stop()
		tick = t.C
	}
	lastTime, last := g.measure()
	var (
		best   float64
		settle = autoSettle
		misses int
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
		rate := float64(c-last) / now.Sub(lastTime).Seconds()
		last, lastTime = c, now
		if settle > 0 {
			settle--
			continue
		}
		if !g.backlogged() {
			continue
		}
		if rate < best*autoGain {
			if misses++; misses >= autoPatience {
				return
			}
			continue
		}
		best, misses = rate, 0
		n := g.s.Streams()
		if n >= g.layer.Streams {
			return
		}
		g.grow(min(2*n, g.layer.Streams) - n)
		settle = autoSettle
	}
}

// measure returns the time and the credit the peer has granted so far,
// which grows with what its application reads.
func (g *grower) measure() (time.Time, int64) {
	if g.fake != nil {
		return g.fake.measure()
	}
	now := time.Now()
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return now, g.s.credit
}

// backlogged reports whether data waits for a substream right now.
func (g *grower) backlogged() bool {
	if g.fake != nil {
		return g.fake.backlogged()
	}
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	return len(g.s.queue) > 0
}

// grow adds k substreams. A failed dial only stops the growth: the
// session goes on with what it has.
func (g *grower) grow(k int) {
	ctx, cancel := context.WithTimeout(context.Background(), layer.DefaultHandshakeTimeout)
	defer cancel()
	go func() {
		select {
		case <-g.s.die:
			cancel()
		case <-ctx.Done():
		}
	}()
	for range k {
		n := g.s.Streams()
		c, err := g.layer.dialSubstream(ctx, g.network, g.address, g.lower,
			join{index: n, count: g.layer.initial(), max: g.layer.Streams, id: g.id})
		if err != nil {
			return
		}
		if !g.s.add(c) {
			c.Close()
			return
		}
	}
}

package compress

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Stats are what every connection of one layer carried since the process
// started: what a metrics endpoint exports (vlink serve --metrics). They
// cost an atomic add per frame.
type Stats struct {
	Layer string
	// Written is what the application wrote, Sent the wire bytes it took,
	// framing included: Written/Sent is the compression ratio.
	Written, Sent uint64
	// Received is the wire bytes of the frames read, Decoded the
	// application bytes they held.
	Received, Decoded uint64
}

// AdaptiveStats are the adaptive layer's choices since the process
// started.
type AdaptiveStats struct {
	// Rungs are the application bytes written at each setting ("off",
	// "s2-1", "zstd-6", ...; see Auto.Rungs), probes included.
	Rungs map[string]uint64
	// Moves counts the controllers' changes of setting.
	Moves uint64
}

type counters struct {
	written, sent, received, decoded atomic.Uint64
}

// layerCounters holds each layer's counters, by name; never written
// after the package is initialised.
var layerCounters = func() map[string]*counters {
	m := map[string]*counters{"adaptive": {}}
	for _, s := range codecSpecs {
		m[s.name] = &counters{}
	}
	return m
}()

// adaptive holds the adaptive layer's counters: one per rung name, made
// as ladders name them (a bounded set: the codecs times their levels).
var adaptive struct {
	mu    sync.Mutex
	rungs map[string]*atomic.Uint64
	moves atomic.Uint64
}

// rungCounter returns the counter of the rung called name.
func rungCounter(name string) *atomic.Uint64 {
	adaptive.mu.Lock()
	defer adaptive.mu.Unlock()
	if adaptive.rungs == nil {
		adaptive.rungs = map[string]*atomic.Uint64{}
	}
	c, ok := adaptive.rungs[name]
	if !ok {
		c = new(atomic.Uint64)
		adaptive.rungs[name] = c
	}
	return c
}

// ReadStats returns every layer's counts so far, sorted by layer.
func ReadStats() []Stats {
	out := make([]Stats, 0, len(layerCounters))
	for name, c := range layerCounters {
		out = append(out, Stats{Layer: name, Written: c.written.Load(), Sent: c.sent.Load(),
			Received: c.received.Load(), Decoded: c.decoded.Load()})
	}
	slices.SortFunc(out, func(a, b Stats) int { return strings.Compare(a.Layer, b.Layer) })
	return out
}

// ReadAdaptiveStats returns the adaptive layer's counts so far.
func ReadAdaptiveStats() AdaptiveStats {
	adaptive.mu.Lock()
	defer adaptive.mu.Unlock()
	s := AdaptiveStats{Rungs: make(map[string]uint64, len(adaptive.rungs)), Moves: adaptive.moves.Load()}
	for name, c := range adaptive.rungs {
		s.Rungs[name] = c.Load()
	}
	return s
}

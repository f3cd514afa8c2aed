package vlink

import (
	"sync"
	"time"
)

// A listener takes a first flight (firstflight.go) without a challenge
// only once: anyone on the path can record a hello with its mark and the
// encryption layer's first message, and send them again. The replay could
// not finish the layer's handshake (it lacks the dialer's ephemeral key),
// but the listener would have admitted it (dialed its target) for
// nothing. So, as TLS 1.3 servers do with early data (RFC 8446 §8), the
// listener keeps the mark of every first
// flight it took within the window its time allows, and answers a
// repeated one, an old one, or one from a future further than the window,
// the long way: with a challenge, which a replay cannot answer.
const (
	// firstFlightWindow is how far a first flight's time may lie from
	// the listener's clock. Dialers whose clocks are further off still
	// connect, the long way.
	firstFlightWindow = 10 * time.Second
	// maxFirstFlights bounds the marks kept per generation (two
	// generations are kept): beyond it, at more than about 26,000 keyed
	// connections a second, the rest go the long way rather than grow
	// the record.
	maxFirstFlights = 1 << 19
)

// replayRecord holds the marks of the first flights a listener took,
// in two generations of twice the window each: a mark stays at least
// as long as its hello could pass the time check.
type replayRecord struct {
	mu        sync.Mutex
	cur, prev map[[markSize]byte]struct{}
	since     time.Time // when cur began
	max       int       // marks per generation: maxFirstFlights
}

// A listener that restarts loses its record, so a first flight it took
// in its previous life can be replayed to it within the window: it then
// admits the connection again, which goes no further. That is why a
// first flight carries no application data yet: data in it would reach
// the target a second time. A listener that takes data in the first
// flight will have to refuse first flights dated before its start plus
// the window, and listeners sharing a key to share their record.

func newReplayRecord(start time.Time) *replayRecord {
	return &replayRecord{since: start, max: maxFirstFlights}
}

// fresh reports whether a first flight with this mark, dated sent (Unix
// milliseconds), may be taken at now, and records it if so.
func (r *replayRecord) fresh(mark []byte, sent uint64, now time.Time) bool {
	t := time.UnixMilli(int64(min(sent, 1<<62)))
	if t.Before(now.Add(-firstFlightWindow)) || t.After(now.Add(firstFlightWindow)) {
		return false
	}
	var k [markSize]byte
	copy(k[:], mark)
	r.mu.Lock()
	defer r.mu.Unlock()
	if gen := 2 * firstFlightWindow; now.Sub(r.since) >= gen {
		r.prev, r.cur = r.cur, nil
		if now.Sub(r.since) >= 2*gen {
			r.prev = nil // idle for longer than both
		}
		r.since = now
	}
	if _, seen := r.cur[k]; seen {
		return false
	}
	if _, seen := r.prev[k]; seen {
		return false
	}
	if len(r.cur) >= r.max {
		return false
	}
	if r.cur == nil {
		r.cur = make(map[[markSize]byte]struct{})
	}
	r.cur[k] = struct{}{}
	return true
}

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
	started   time.Time // when the listener started: see takesEarly
	max       int       // marks per generation: maxFirstFlights
}

// A listener that restarts loses its record, so a first flight it took
// in its previous life can be replayed to it within the window: it then
// admits the connection again, which goes no further. Data in such a
// first flight (early data) would reach the target a second time, so a
// listener takes data only in first flights dated after its start plus
// the window: its previous life, which ended before that start, took
// none dated so late (takesEarly). And since the record is one
// listener's, only a listener with an identity takes data: a first
// flight names the identity it is for (the hello's first field, under
// the mark), so one taken by another listener of the same key is not
// taken here. Listeners that share an identity file share that exposure
// (Policy.Identity).

func newReplayRecord(start time.Time) *replayRecord {
	return &replayRecord{since: start, started: start, max: maxFirstFlights}
}

// takesEarly reports whether the listener takes the data in the first
// flight of hello m, which it takes (takesFirst).
func (l *Listener) takesEarly(m *message) bool {
	sent := time.UnixMilli(int64(min(m.first.time, 1<<62)))
	return l.offersEarly() && m.first.static != nil && sent.After(l.replay.started.Add(firstFlightWindow))
}

// offersEarly reports whether the listener takes early data at all.
func (l *Listener) offersEarly() bool {
	return l.static != nil && !l.cfg.Policy.RefuseEarlyData
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

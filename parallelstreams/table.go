package parallelstreams

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// SourceShare bounds what one source address (the dialer's IP, whatever
// its port) may hold in a listener's table: at most 1/SourceShare of the
// substreams the listener holds for sessions not yet complete (its
// MaxHandshakes, so 64 of the default 256), and never fewer than the
// substreams its hello asks for, so that one session of any size the
// listener's policy allows fits. A source that fills its share with
// sessions it never completes gets busy refusals of its own, and dialers
// from elsewhere still get in.
const SourceShare = 4

// A table is a listener's record of parallel sessions: those still
// waiting for members, and those in auto mode, which may grow.
type table struct {
	mu      sync.Mutex
	held    int                // substreams reserved: reading their join header or waiting in pending
	heldBy  map[netip.Addr]int // held, by source address
	pending map[sessionID]*pendingSession
	live    map[sessionID]*liveSession
}

type pendingSession struct {
	first join
	layer *Layer
	// j is the first member's junction: the session goes to the
	// listener through it, so the nested hello sees that dialer's
	// address and nesting depth, not those of another session.
	j       layer.Junction
	members map[int]member
	timer   *time.Timer
}

// A member is a substream held in the table, and where it came from.
type member struct {
	c   net.Conn
	src netip.Addr
}

type liveSession struct {
	s     *Session
	max   int
	seen  map[int]bool
	layer *Layer
}

// tableOf returns j's listener's table, made on first use.
func tableOf(j layer.Junction) *table {
	return j.State("parallel", func() any { return newTable(j.Done()) }).(*table)
}

func newTable(done <-chan struct{}) *table {
	t := &table{heldBy: map[netip.Addr]int{}, pending: map[sessionID]*pendingSession{}, live: map[sessionID]*liveSession{}}
	// The listener's end drops every session still waiting. This
	// goroutine ends with the listener.
	go func() {
		<-done
		t.mu.Lock()
		for id, p := range t.pending {
			p.timer.Stop()
			t.dropLocked(p)
			delete(t.pending, id)
		}
		t.mu.Unlock()
	}()
	return t
}

// reserve counts one more held substream from src, within limit for the
// table and src's share of it (SourceShare, at least streams), or returns
// an error matching layer.ErrBusy.
func (t *table) reserve(src netip.Addr, limit, streams int) error {
	share := max(limit/SourceShare, streams)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.held >= limit:
		return fmt.Errorf("%w: %d parallel substreams already wait for their sessions", layer.ErrBusy, t.held)
	case t.heldBy[src] >= share:
		return fmt.Errorf("%w: %d parallel substreams from %v already wait for their sessions", layer.ErrBusy, t.heldBy[src], src)
	}
	t.held++
	t.heldBy[src]++
	return nil
}

func (t *table) release(src netip.Addr) {
	t.mu.Lock()
	t.releaseLocked(src)
	t.mu.Unlock()
}

func (t *table) releaseLocked(src netip.Addr) {
	t.held--
	t.heldBy[src]--
	if t.heldBy[src] <= 0 {
		delete(t.heldBy, src)
	}
}

// dropLocked closes a pending session's members and releases their room.
func (t *table) dropLocked(p *pendingSession) {
	for _, m := range p.members {
		m.c.Close()
		t.releaseLocked(m.src)
	}
}

// sourceOf returns the address a dialer connects from, without its port:
// the unit a dialer cannot multiply at will. Addresses that are not IP
// share the zero address.
func sourceOf(a net.Addr) netip.Addr {
	ap, _ := netconn.AddrPort(a)
	return ap.Addr()
}

// admit reads c's join header and files c with its session.
func (t *table) admit(c net.Conn, l *Layer, j layer.Junction) {
	m := member{c: c, src: sourceOf(j.RemoteAddr())}
	jh, err := readJoin(c, j)
	if err == nil {
		err = checkJoin(jh, l)
	}
	if err != nil {
		t.release(m.src)
		c.Close()
		return
	}
	t.file(m, jh, l, j)
}

// readJoin reads a join header within the listener's handshake timeout,
// or until the listener closes.
func readJoin(c net.Conn, j layer.Junction) (join, error) {
	c.SetReadDeadline(time.Now().Add(j.Timeout()))
	// The watcher may run only after the read is over and the listener
	// has closed since: reading tells it whether the deadline is still
	// ours to cut short, or the session's, which it must not touch.
	var mu sync.Mutex
	reading := true
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-j.Done():
			mu.Lock()
			if reading {
				c.SetReadDeadline(time.Unix(1, 0))
			}
			mu.Unlock()
		case <-done:
		}
	}()
	var b [joinSize]byte
	_, err := io.ReadFull(c, b[:])
	mu.Lock()
	reading = false
	mu.Unlock()
	if err != nil {
		return join{}, fmt.Errorf("reading join header: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	return parseJoin(&b)
}

// checkJoin holds the join header to what the substream's hello asked
// for, which the listener's policy has checked.
func checkJoin(jh join, l *Layer) error {
	if jh.max != l.Streams || jh.count != l.initial() {
		return fmt.Errorf("%w: join header announces %d of %d substreams, the hello %d of %d",
			ErrProtocol, jh.count, jh.max, l.initial(), l.Streams)
	}
	return nil
}

// file adds m to its session: a pending one, which is delivered once
// complete, or a live one in auto mode, which grows. j is the junction m
// came through.
func (t *table) file(m member, jh join, l *Layer, j layer.Junction) {
	// Deliver may wait for a handshake slot: never with the lock held.
	if s, sj := t.fileLocked(m, jh, l, j); s != nil {
		sj.Deliver(s)
	}
}

// fileLocked files m and returns the session it completes, if any, with
// the junction to deliver it through.
func (t *table) fileLocked(m member, jh join, l *Layer, j layer.Junction) (*Session, layer.Junction) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := m.c
	if ls, ok := t.live[jh.id]; ok {
		t.releaseLocked(m.src)
		if jh.index < jh.count || ls.seen[jh.index] || ls.layer.Window != l.Window || !ls.s.add(c) {
			c.Close()
			return nil, nil
		}
		ls.seen[jh.index] = true
		return nil, nil
	}
	p, ok := t.pending[jh.id]
	if !ok {
		if jh.index >= jh.count {
			// A late member of a session that is gone or never was.
			t.releaseLocked(m.src)
			c.Close()
			return nil, nil
		}
		p = &pendingSession{first: jh, layer: l, j: j, members: map[int]member{}}
		id := jh.id
		p.timer = time.AfterFunc(j.Timeout(), func() { t.expire(id, p) })
		t.pending[id] = p
	}
	if _, dup := p.members[jh.index]; dup || jh.index >= jh.count || p.layer.Window != l.Window {
		t.releaseLocked(m.src)
		c.Close()
		return nil, nil
	}
	p.members[jh.index] = m
	if len(p.members) < jh.count {
		return nil, nil
	}
	// Complete.
	p.timer.Stop()
	delete(t.pending, jh.id)
	conns := make([]net.Conn, 0, len(p.members))
	idx := make([]int, 0, len(p.members))
	for i, pm := range p.members {
		idx = append(idx, i)
		t.releaseLocked(pm.src)
	}
	sort.Ints(idx)
	for _, i := range idx {
		conns = append(conns, p.members[i].c)
	}
	s := newSession(jh.id, int64(l.Window), l.StallTimeout, conns)
	if jh.max > jh.count {
		seen := map[int]bool{}
		for _, i := range idx {
			seen[i] = true
		}
		t.live[jh.id] = &liveSession{s: s, max: jh.max, seen: seen, layer: l}
		go func() {
			<-s.die
			t.mu.Lock()
			delete(t.live, jh.id)
			t.mu.Unlock()
		}()
	}
	return s, p.j
}

// expire drops a session whose members did not all arrive in time.
func (t *table) expire(id sessionID, p *pendingSession) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending[id] != p {
		return
	}
	delete(t.pending, id)
	t.dropLocked(p)
}

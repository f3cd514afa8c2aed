package parallelstreams

import (
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// A table is a listener's record of parallel sessions: those still
// waiting for members, and those in auto mode, which may grow.
type table struct {
	j layer.Junction

	mu      sync.Mutex
	held    int // substreams reading their join header or waiting in pending
	pending map[sessionID]*pendingSession
	live    map[sessionID]*liveSession
}

type pendingSession struct {
	first   join
	layer   *Layer
	members map[int]net.Conn
	timer   *time.Timer
}

type liveSession struct {
	s     *Session
	max   int
	seen  map[int]bool
	layer *Layer
}

func newTable(j layer.Junction) *table {
	t := &table{j: j, pending: map[sessionID]*pendingSession{}, live: map[sessionID]*liveSession{}}
	// The listener's end drops every session still waiting. This
	// goroutine ends with the listener.
	go func() {
		<-j.Done()
		t.mu.Lock()
		for id, p := range t.pending {
			p.timer.Stop()
			p.closeAll()
			t.held -= len(p.members)
			delete(t.pending, id)
		}
		t.mu.Unlock()
	}()
	return t
}

// reserve counts one more held substream, within limit.
func (t *table) reserve(limit int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held >= limit {
		return false
	}
	t.held++
	return true
}

func (t *table) release(n int) {
	t.mu.Lock()
	t.held -= n
	t.mu.Unlock()
}

func (p *pendingSession) closeAll() {
	for _, c := range p.members {
		c.Close()
	}
}

// admit reads c's join header and files c with its session.
func (t *table) admit(c net.Conn, l *Layer, j layer.Junction) {
	jh, err := readJoin(c, j)
	if err == nil {
		err = checkJoin(jh, l)
	}
	if err != nil {
		t.release(1)
		c.Close()
		return
	}
	t.file(c, jh, l)
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

// file adds c to its session: a pending one, which is delivered once
// complete, or a live one in auto mode, which grows.
func (t *table) file(c net.Conn, jh join, l *Layer) {
	// Deliver may wait for a handshake slot: never with the lock held.
	if s := t.fileLocked(c, jh, l); s != nil {
		t.j.Deliver(s)
	}
}

// fileLocked files c and returns the session it completes, if any.
func (t *table) fileLocked(c net.Conn, jh join, l *Layer) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ls, ok := t.live[jh.id]; ok {
		t.held--
		if jh.index < jh.count || ls.seen[jh.index] || ls.layer.Window != l.Window || !ls.s.add(c) {
			c.Close()
			return nil
		}
		ls.seen[jh.index] = true
		return nil
	}
	p, ok := t.pending[jh.id]
	if !ok {
		if jh.index >= jh.count {
			// A late member of a session that is gone or never was.
			t.held--
			c.Close()
			return nil
		}
		p = &pendingSession{first: jh, layer: l, members: map[int]net.Conn{}}
		id := jh.id
		p.timer = time.AfterFunc(t.j.Timeout(), func() { t.expire(id, p) })
		t.pending[id] = p
	}
	if _, dup := p.members[jh.index]; dup || jh.index >= jh.count || p.layer.Window != l.Window {
		t.held--
		c.Close()
		return nil
	}
	p.members[jh.index] = c
	if len(p.members) < jh.count {
		return nil
	}
	// Complete.
	p.timer.Stop()
	delete(t.pending, jh.id)
	t.held -= len(p.members)
	conns := make([]net.Conn, 0, len(p.members))
	idx := make([]int, 0, len(p.members))
	for i := range p.members {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		conns = append(conns, p.members[i])
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
	return s
}

// expire drops a session whose members did not all arrive in time.
func (t *table) expire(id sessionID, p *pendingSession) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending[id] != p {
		return
	}
	delete(t.pending, id)
	t.held -= len(p.members)
	p.closeAll()
}

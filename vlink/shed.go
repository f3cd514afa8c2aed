package vlink

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// A shedder bounds the handshakes a listener runs at once without ever
// making its accept loop wait.
//
// When all slots are taken, a new connection takes the slot of one not
// yet authenticated, from the source address holding the most such slots,
// its oldest: silent or slow dialers then only ever push each other out,
// and a client from elsewhere gets a slot at once, where waiting for a
// free slot would keep everyone out for the handshake timeout.
//
// But a connection closed to make room is replaced at once by a dialer
// that means harm, and the accept loop would spend itself on that churn
// while a client's connection waits behind it in the kernel's accept
// queue. So a new connection from the source that already holds the most
// slots, or one that finds every slot authenticated, is parked instead: it
// stays open, with no goroutine and no buffer of its own (the kernel holds
// what it sent), until a slot frees, its first bytes show a whole hello
// (or a plain client's data) and a slot can be made for it, or its
// handshake timeout passes. A parked dialer is not refused, so it has no
// reason to reconnect.
type shedder struct {
	max       int           // handshake slots
	maxParked int           // connections parked at most; past it the oldest is closed
	timeout   time.Duration // a parked connection's whole handshake time
	plainAt   time.Duration // a silent connection may then be plain (SniffTimeout); 0: never
	start     func(c net.Conn, accepted time.Time)

	mu      sync.Mutex
	slots   map[net.Conn]*slot
	sources map[netip.Addr][]*slot // open slots, oldest first
	shed    map[net.Conn]bool      // closed to make room, until done
	parked  []*slot                // oldest first
	sweeper *time.Timer            // armed while parked is not empty
	closed  bool
	peek    [len(magic) + headerSize + maxBody]byte // for helloQueuedLocked
}

// A slot is one handshake in progress, or one parked connection.
type slot struct {
	c     net.Conn
	src   netip.Addr
	start time.Time // accepted
	// open: not authenticated yet, so it may be shed. A connection leaves
	// this state when its hello passed (with a key, its proof): from then
	// on its cost is the listener's own choice.
	open bool
}

// sweepEvery is how often parked connections are looked at: the most a
// prompt client parked with an attacker's address waits for its slot.
const sweepEvery = 50 * time.Millisecond

// newShedder returns a shedder of max slots; start runs the handshake of
// a parked connection given a slot later.
func newShedder(max int, timeout, plainAt time.Duration, start func(net.Conn, time.Time)) *shedder {
	return &shedder{
		max: max, maxParked: parkedPerSlot * max, timeout: timeout, plainAt: plainAt, start: start,
		slots: map[net.Conn]*slot{}, sources: map[netip.Addr][]*slot{}, shed: map[net.Conn]bool{},
	}
}

// parkedPerSlot sizes the parking lot: a parked connection costs the
// listener a descriptor and a list entry, the kernel a socket.
const parkedPerSlot = 16

// admit gives c, accepted now, a slot (shedding another connection if need
// be) and reports true, or parks c and reports false: the caller starts
// c's handshake only on true.
func (s *shedder) admit(c net.Conn, now time.Time) bool {
	sl := &slot{c: c, src: sourceOf(c.RemoteAddr()), start: now, open: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) >= s.max {
		victim := s.victimLocked()
		if victim == nil || victim.src == sl.src && !s.helloQueuedLocked(c) {
			s.parkLocked(sl)
			return false
		}
		s.shedLocked(victim)
	}
	s.addLocked(sl)
	return true
}

func (s *shedder) addLocked(sl *slot) {
	s.slots[sl.c] = sl
	s.sources[sl.src] = append(s.sources[sl.src], sl)
}

// shedLocked closes victim's connection to make room: its handshake fails
// and calls done.
func (s *shedder) shedLocked(victim *slot) {
	s.freeLocked(victim)
	s.shed[victim.c] = true
	victim.c.Close()
}

// parkLocked parks sl, closing the oldest parked connection if the lot is
// full, and arms the sweeper.
func (s *shedder) parkLocked(sl *slot) {
	if s.closed {
		sl.c.Close()
		return
	}
	if len(s.parked) >= s.maxParked {
		s.parked[0].c.Close()
		s.parked[0] = nil
		s.parked = s.parked[1:]
	}
	s.parked = append(s.parked, sl)
	if s.sweeper == nil {
		s.sweeper = time.AfterFunc(sweepEvery, s.sweep)
	}
}

// sweep closes the parked connections whose time is up, and gives a slot
// to those that sent a whole hello (or may be taken as plain), shedding
// for them as admit would, a few at a time so that dialers who complete
// hellos only to go silent cannot turn the lot into churn.
func (s *shedder) sweep() {
	var started []*slot
	s.mu.Lock()
	now := time.Now()
	keep := s.parked[:0]
	for _, p := range s.parked {
		age := now.Sub(p.start)
		switch {
		case age >= s.timeout:
			p.c.Close()
			continue
		case len(started) < s.max/16+1 && (s.plainAt > 0 && age >= s.plainAt || s.helloQueuedLocked(p.c)):
			if len(s.slots) < s.max {
				s.addLocked(p)
				started = append(started, p)
				continue
			}
			if victim := s.victimLocked(); victim != nil {
				s.shedLocked(victim)
				s.addLocked(p)
				started = append(started, p)
				continue
			}
		}
		keep = append(keep, p)
	}
	clear(s.parked[len(keep):])
	s.parked = keep
	if len(s.parked) > 0 && !s.closed {
		s.sweeper.Reset(sweepEvery)
	} else {
		s.sweeper = nil
	}
	s.mu.Unlock()
	for _, p := range started {
		s.start(p.c, p.start)
	}
}

// helloQueuedLocked reports whether c has received, and not yet read, a
// whole hello frame after the magic, or bytes that are no hello at all (a
// plain client's): what a parked connection shows to be given a slot.
func (s *shedder) helloQueuedLocked(c net.Conn) bool {
	return wholeHello(s.peek[:peekQueued(c, s.peek[:])])
}

// wholeHello reports whether b, a connection's first bytes, hold the
// magic and a whole hello frame, or are not the start of a hello at all.
func wholeHello(b []byte) bool {
	m := min(len(b), len(magic))
	if string(b[:m]) != magic[:m] {
		return true
	}
	if len(b) < len(magic)+headerSize {
		return false
	}
	return len(b) >= len(magic)+headerSize+header(b[len(magic):]).Len()
}

// victimLocked returns the oldest open slot of the source holding the
// most open slots (the oldest such source's on a tie), or nil if no slot
// is open.
func (s *shedder) victimLocked() *slot {
	var victims []*slot
	for _, q := range s.sources {
		if len(q) > len(victims) || len(q) == len(victims) && q[0].start.Before(victims[0].start) {
			victims = q
		}
	}
	if len(victims) == 0 {
		return nil
	}
	return victims[0]
}

// authenticated marks c's handshake as one that may no longer be shed.
func (s *shedder) authenticated(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[c]; sl != nil && sl.open {
		s.unqueueLocked(sl)
	}
}

// done frees c's slot and reports whether c was shed to make room. The
// oldest parked connection, if any, takes the slot: its handshake starts
// before done returns.
func (s *shedder) done(c net.Conn) (shed bool) {
	s.mu.Lock()
	if s.shed[c] {
		delete(s.shed, c)
		s.mu.Unlock()
		return true
	}
	var next *slot
	if sl := s.slots[c]; sl != nil {
		s.freeLocked(sl)
		if len(s.parked) > 0 && !s.closed {
			next = s.parked[0]
			s.parked[0] = nil
			s.parked = s.parked[1:]
			s.addLocked(next)
		}
	}
	s.mu.Unlock()
	if next != nil {
		s.start(next.c, next.start)
	}
	return false
}

// close closes the parked connections and parks no more.
func (s *shedder) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, p := range s.parked {
		p.c.Close()
	}
	s.parked = nil
	if s.sweeper != nil {
		s.sweeper.Stop()
		s.sweeper = nil
	}
}

func (s *shedder) freeLocked(sl *slot) {
	if sl.open {
		s.unqueueLocked(sl)
	}
	delete(s.slots, sl.c)
}

// unqueueLocked takes sl off its source's queue of open slots.
func (s *shedder) unqueueLocked(sl *slot) {
	sl.open = false
	q := s.sources[sl.src]
	for i, o := range q {
		if o == sl {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(s.sources, sl.src)
	} else {
		s.sources[sl.src] = q
	}
}

// sourceOf returns the address a connection comes from, without its
// port: the unit a dialer cannot multiply at will. Connections that are
// not IP share the zero address.
func sourceOf(a net.Addr) netip.Addr {
	ap, _ := netconn.AddrPort(a)
	return ap.Addr()
}

package vlink

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// A shedder bounds the handshakes a listener runs at once without ever
// making its accept loop wait: when all slots are taken, a new connection
// takes the slot of one not yet authenticated, from the source address
// holding the most such slots, its oldest. Silent or slow dialers then
// only ever push each other out, and a client from elsewhere (or a
// prompt one from the same address) gets a slot at once, where waiting
// for a free slot would keep everyone out for the handshake timeout.
type shedder struct {
	max int

	mu      sync.Mutex
	slots   map[net.Conn]*slot
	sources map[netip.Addr][]*slot // open slots, oldest first
	shed    map[net.Conn]bool      // closed to make room, until done
}

// A slot is one handshake in progress.
type slot struct {
	c     net.Conn
	src   netip.Addr
	start time.Time
	// open: not authenticated yet, so it may be shed. A connection leaves
	// this state when its hello passed (with a key, its proof): from then
	// on its cost is the listener's own choice.
	open bool
}

func newShedder(max int) *shedder {
	return &shedder{max: max, slots: map[net.Conn]*slot{}, sources: map[netip.Addr][]*slot{}, shed: map[net.Conn]bool{}}
}

// admit gives c a slot, shedding another connection if need be, and
// reports false when every slot is held by an authenticated handshake:
// the caller then closes c.
func (s *shedder) admit(c net.Conn) bool {
	sl := &slot{c: c, src: sourceOf(c.RemoteAddr()), start: time.Now(), open: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) >= s.max {
		victim := s.victimLocked()
		if victim == nil {
			return false
		}
		s.freeLocked(victim)
		s.shed[victim.c] = true
		victim.c.Close() // its handshake fails and calls done
	}
	s.slots[c] = sl
	s.sources[sl.src] = append(s.sources[sl.src], sl)
	return true
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

// done frees c's slot and reports whether c was shed to make room.
func (s *shedder) done(c net.Conn) (shed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shed[c] {
		delete(s.shed, c)
		return true
	}
	if sl := s.slots[c]; sl != nil {
		s.freeLocked(sl)
	}
	return false
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
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

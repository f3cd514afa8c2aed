package vlink

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// A shedder bounds the handshakes a listener runs at once without ever
// making its accept loop wait.
//
// When all slots are taken, a new connection whose first flight has come
// whole (a hello, or a plain client's first bytes) takes the slot of one
// not yet authenticated, from the source address holding the most such
// slots, its oldest: silent or slow dialers then only ever push each
// other out, and a client gets a slot at once, where waiting for a free
// slot would keep everyone out for the handshake timeout. On a keyed
// listener only a hello that proves the key in its first flight (its
// mark, firstflight.go) makes room: an address proves nothing, as an
// attacker may have many or share the client's.
//
// But a connection closed to make room is replaced at once by a dialer
// that means harm, and the accept loop would spend itself on that churn
// while a client's connection waits behind it in the kernel's accept
// queue. So any other new connection is parked instead: it stays open,
// with no goroutine and no buffer of its own (the kernel holds what it
// sent), until a slot frees, its first bytes show that it may make room
// (a goroutine watches for them a moment after it is parked, the sweep
// after that), or its handshake timeout passes. A parked dialer is not
// refused, so it has no reason to reconnect.
type shedder struct {
	max       int           // handshake slots
	maxParked int           // connections parked at most; past it the oldest is closed
	timeout   time.Duration // a parked connection's whole handshake time
	plainAt   time.Duration // a silent connection may then be plain (SniffTimeout); 0: never
	start     func(c net.Conn, accepted time.Time)
	// marked reports whether b, the first bytes waiting in c, are a
	// hello marked with a key the listener holds (firstflight.go); nil
	// on a listener without a key. On a keyed listener, only a marked
	// hello makes room: a connection without one waits for a free slot.
	markedHello func(c net.Conn, b []byte) bool

	mu       sync.Mutex
	slots    map[net.Conn]*slot
	sources  map[netip.Addr][]*slot // open slots, oldest first
	marked   []*slot                // marked slots, oldest first
	shed     map[net.Conn]bool      // closed to make room, until done
	parked   []*slot                // oldest first
	sweeper  *time.Timer            // armed while parked is not empty
	closed   bool
	watching int                                     // goroutines watching for a parked connection's first flight
	peek     [len(magic) + headerSize + maxBody]byte // for firstFlightLocked
}

// A slot is one handshake in progress, or one parked connection.
type slot struct {
	c     net.Conn
	src   netip.Addr
	start time.Time // accepted
	state slotState
	// unmarked: a whole hello without a mark was seen waiting in c (so
	// the sweep need not check it again: its bytes wait unread).
	unmarked bool
	watched  bool // parked, and a watcher waits for its first flight
}

// slotState says which connections may take a slot's place.
type slotState uint8

const (
	// open: nothing proven yet; any newcomer that may make room takes
	// its place first.
	open slotState = iota
	// marked: its hello carries the key's mark, but the challenge has
	// not been answered: only another marked hello takes its place, so
	// that one recorded and replayed hello cannot hold slots for good.
	marked
	// authenticated: its hello passed (with a key, its proof); from
	// then on its cost is the listener's own choice.
	authenticated
)

// sweepEvery is how often parked connections are looked at: the most a
// prompt client parked with an attacker's address waits for its slot.
const sweepEvery = 50 * time.Millisecond

// newShedder returns a shedder of max slots; start runs the handshake of
// a parked connection given a slot later; markedHello is nil on a
// listener without a key.
func newShedder(max int, timeout, plainAt time.Duration, markedHello func(net.Conn, []byte) bool, start func(net.Conn, time.Time)) *shedder {
	return &shedder{
		max: max, maxParked: parkedPerSlot * max, timeout: timeout, plainAt: plainAt, start: start, markedHello: markedHello,
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
	sl := &slot{c: c, src: sourceOf(c.RemoteAddr()), start: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slots) >= s.max {
		whole, proven := s.firstFlightLocked(sl)
		var victim *slot
		switch {
		case proven:
			victim = s.victimLocked(true)
			sl.state = marked
		case s.markedHello != nil:
			// Keyed: without the mark, wait for a free slot.
		case whole:
			victim = s.victimLocked(false)
		default:
			// Its first bytes have not come: it waits for them
			// (watched, below) before it pushes anyone out, so that
			// dialers who go silent after connecting, from however
			// many addresses, push out nobody.
		}
		if victim == nil {
			s.parkLocked(sl, whole)
			return false
		}
		s.shedLocked(victim)
	}
	s.addLocked(sl)
	return true
}

func (s *shedder) addLocked(sl *slot) {
	s.slots[sl.c] = sl
	switch sl.state {
	case open:
		s.sources[sl.src] = append(s.sources[sl.src], sl)
	case marked:
		s.marked = append(s.marked, sl)
	}
}

// shedLocked closes victim's connection to make room: its handshake fails
// and calls done.
func (s *shedder) shedLocked(victim *slot) {
	s.freeLocked(victim)
	s.shed[victim.c] = true
	victim.c.Close()
}

// parkLocked parks sl, closing the oldest parked connection if the lot is
// full, and arms the sweeper; if sl's first flight is not whole yet, it
// is watched for a moment.
func (s *shedder) parkLocked(sl *slot, whole bool) {
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
	if !whole && s.watching < maxWatching {
		s.watching++
		sl.watched = true
		go s.watch(sl)
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
		switch {
		case now.Sub(p.start) >= s.timeout:
			p.c.Close()
			continue
		case !p.watched && len(started) <= s.max/16 && s.placeLocked(p, now):
			started = append(started, p)
			continue
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

// placeLocked gives parked p a slot if its first flight shows it is ready
// for one (a whole hello, or a client that may be plain), shedding for it
// as admit would; on a keyed listener only a marked hello sheds, the
// others take free slots. The caller takes p off the lot and starts it.
func (s *shedder) placeLocked(p *slot, now time.Time) bool {
	whole, proven := s.firstFlightLocked(p)
	if !whole && !(s.plainAt > 0 && now.Sub(p.start) >= s.plainAt) {
		return false
	}
	if len(s.slots) >= s.max {
		if !proven && s.markedHello != nil {
			return false
		}
		victim := s.victimLocked(proven)
		if victim == nil {
			return false
		}
		s.shedLocked(victim)
	}
	if proven {
		p.state = marked
	}
	s.addLocked(p)
	return true
}

// watch waits a moment for the first flight of sl, parked before it came,
// and places it as soon as it is whole: a prompt client parked while
// every slot is taken then waits for its own bytes, not for the sweep.
func (s *shedder) watch(sl *slot) {
	whole := waitWhole(sl.c, watchFor)
	s.mu.Lock()
	s.watching--
	sl.watched = false
	i := slices.Index(s.parked, sl)
	place := whole && i >= 0 && !s.closed && s.placeLocked(sl, time.Now())
	if place {
		s.parked = slices.Delete(s.parked, i, i+1)
	}
	s.mu.Unlock()
	if place {
		s.start(sl.c, sl.start)
	}
}

// A newly parked connection whose first flight has not come is watched
// for watchFor, by at most maxWatching goroutines at once: a client's
// hello follows its connection within a round trip, and beyond the
// watchers, the sweep looks every sweepEvery.
const (
	watchFor    = 20 * time.Millisecond
	maxWatching = 64
)

// firstFlightLocked looks at the bytes waiting in sl's connection, unread:
// whole is true once they hold the magic and a whole hello frame, or bytes
// that are no hello at all (a plain client's); proven, when the hello
// carries the mark of a key the listener holds.
func (s *shedder) firstFlightLocked(sl *slot) (whole, proven bool) {
	if sl.unmarked {
		return true, false
	}
	b := s.peek[:peekQueued(sl.c, s.peek[:])]
	if !wholeHello(b) {
		return false, false
	}
	if s.markedHello != nil && s.markedHello(sl.c, b) {
		return true, true
	}
	sl.unmarked = true
	return true, false
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

// victimLocked returns the slot to shed for a newcomer: the oldest open
// slot of the source holding the most open slots (the oldest such
// source's on a tie), else, for a marked newcomer, the oldest marked
// slot; or nil.
func (s *shedder) victimLocked(forMarked bool) *slot {
	var victims []*slot
	for _, q := range s.sources {
		if len(q) > len(victims) || len(q) == len(victims) && q[0].start.Before(victims[0].start) {
			victims = q
		}
	}
	if len(victims) > 0 {
		return victims[0]
	}
	if forMarked && len(s.marked) > 0 {
		return s.marked[0]
	}
	return nil
}

// markedRead records that c's hello, read by its handshake, carries the
// key's mark.
func (s *shedder) markedRead(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[c]; sl != nil && sl.state == open {
		s.unqueueLocked(sl)
		sl.state = marked
		s.addLocked(sl)
	}
}

// authenticated marks c's handshake as one that may no longer be shed.
func (s *shedder) authenticated(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slots[c]; sl != nil && sl.state != authenticated {
		s.unqueueLocked(sl)
		sl.state = authenticated
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
		// Not a watched one: its watcher still owns its deadline.
		if i := slices.IndexFunc(s.parked, func(p *slot) bool { return !p.watched }); i >= 0 && !s.closed {
			next = s.parked[i]
			s.parked = slices.Delete(s.parked, i, i+1)
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
	s.unqueueLocked(sl)
	delete(s.slots, sl.c)
}

// unqueueLocked takes sl off the queue its state puts it in.
func (s *shedder) unqueueLocked(sl *slot) {
	switch sl.state {
	case open:
		q := remove(s.sources[sl.src], sl)
		if len(q) == 0 {
			delete(s.sources, sl.src)
		} else {
			s.sources[sl.src] = q
		}
	case marked:
		s.marked = remove(s.marked, sl)
	}
}

// remove returns q without sl, keeping the order.
func remove(q []*slot, sl *slot) []*slot {
	if i := slices.Index(q, sl); i >= 0 {
		q = slices.Delete(q, i, i+1)
	}
	return q
}

// sourceOf returns the address a connection comes from, without its
// port: the unit a dialer cannot multiply at will. Connections that are
// not IP share the zero address.
func sourceOf(a net.Addr) netip.Addr {
	ap, _ := netconn.AddrPort(a)
	return ap.Addr()
}

package dgram

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// Defaults of ListenConfig.
const (
	DefaultMaxSessions = 1024
	DefaultQueue       = 256
	DefaultMaxBuffered = 8 << 20
	// SocketBuffer is the size of the kernel buffers asked for on the
	// UDP sockets that carry sessions (netconn.SetUDPBuffers).
	SocketBuffer = 4 << 20
)

// ListenConfig bounds what a Listener keeps for its clients. The zero
// value holds the defaults.
type ListenConfig struct {
	// MaxSessions bounds the clients served at once. A datagram from a
	// new source beyond it takes the place of the oldest session that
	// never got an answer, as conntrack's early drop does, so a flood of
	// one-way sources cannot lock out new clients; when every session
	// has had one, it is dropped (Listener.Dropped counts it) until a
	// session ends. Zero means DefaultMaxSessions.
	MaxSessions int
	// Queue bounds the datagrams waiting for a session's reader: one that
	// arrives to a full queue is dropped, as a congested router drops.
	// Zero means DefaultQueue.
	Queue int
	// MaxBuffered bounds the bytes of the datagrams waiting in all
	// sessions' queues together, so a flood from many sources holds no
	// more: one that would pass it is dropped. Zero means
	// DefaultMaxBuffered.
	MaxBuffered int
}

// Validate reports whether the bounds are usable.
func (lc ListenConfig) Validate() error {
	if lc.MaxSessions < 0 || lc.Queue < 0 || lc.MaxBuffered < 0 {
		return errors.New("dgram: negative bound")
	}
	return nil
}

// A Listener serves the clients of one UDP socket as connections: the
// first datagram from a source address starts a Session that Accept
// returns, and the later ones from that address are read from it; what
// the Session writes goes back to that address. A Session lasts until it
// is closed (Relay's idle timeout closes nothing: its caller does).
type Listener struct {
	pc     *net.UDPConn
	cfg    ListenConfig
	accept chan *Session

	mu       sync.Mutex
	sessions map[netip.AddrPort]*Session
	born     uint64 // sessions started, for their age
	closed   bool
	err      error // why reading stopped

	buffered int // bytes in the sessions' queues

	done    chan struct{}
	once    sync.Once
	dropped struct{ sessions, datagrams, evicted atomic.Int64 }
}

var _ net.Listener = (*Listener)(nil)

// Listen serves pc's clients. The Listener owns pc: Close closes it.
func (lc ListenConfig) Listen(pc *net.UDPConn) (*Listener, error) {
	if err := lc.Validate(); err != nil {
		return nil, err
	}
	if lc.MaxSessions == 0 {
		lc.MaxSessions = DefaultMaxSessions
	}
	if lc.Queue == 0 {
		lc.Queue = DefaultQueue
	}
	if lc.MaxBuffered == 0 {
		lc.MaxBuffered = DefaultMaxBuffered
	}
	// The clients' bursts wait in the kernel while the reader is not
	// scheduled, rather than being dropped.
	netconn.SetUDPBuffers(pc, SocketBuffer)
	l := &Listener{pc: pc, cfg: lc, accept: make(chan *Session, 64),
		sessions: map[netip.AddrPort]*Session{}, done: make(chan struct{})}
	go l.read()
	return l, nil
}

// read hands each datagram to its source's session.
func (l *Listener) read() {
	buf := make([]byte, MaxDatagram)
	for {
		n, from, err := l.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			if _, crosses := codeOf(err); crosses {
				continue // an ICMP error for a datagram sent earlier
			}
			l.fail(err)
			return
		}
		l.deliver(from, buf[:n])
	}
}

// deliver queues a copy of d for from's session, starting one if there
// is room, or drops it.
func (l *Listener) deliver(from netip.AddrPort, d []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.session(from)
	if s == nil {
		return
	}
	if l.buffered+len(d) > l.cfg.MaxBuffered {
		l.dropped.datagrams.Add(1)
		return
	}
	select {
	case s.q <- append([]byte(nil), d...):
		l.buffered += len(d)
	default:
		l.dropped.datagrams.Add(1)
	}
}

// session returns from's session, starting one if there is room; nil
// drops the datagram. l.mu is held.
func (l *Listener) session(from netip.AddrPort) *Session {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	if s := l.sessions[from]; s != nil {
		return s
	}
	// Nobody accepting is as full as the table: nothing to evict for.
	if l.closed || len(l.accept) == cap(l.accept) || len(l.sessions) >= l.cfg.MaxSessions && !l.evictLocked() {
		l.dropped.sessions.Add(1)
		return nil
	}
	l.born++
	s := &Session{l: l, addr: from, raddr: net.UDPAddrFromAddrPort(from), born: l.born, q: make(chan []byte, l.cfg.Queue), done: make(chan struct{})}
	l.accept <- s // room checked above, under l.mu, which every send holds
	l.sessions[from] = s
	return s
}

// evictLocked ends the oldest session that never got an answer, and
// reports whether there was one. l.mu is held.
func (l *Listener) evictLocked() bool {
	var victim *Session
	for _, s := range l.sessions {
		if !s.answered.Load() && (victim == nil || s.born < victim.born) {
			victim = s
		}
	}
	if victim == nil {
		return false
	}
	victim.closeLocked()
	l.dropped.evicted.Add(1)
	return true
}

func (l *Listener) fail(err error) {
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
	l.Close()
}

// Accept returns the session of the next new client.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case s := <-l.accept:
		return s, nil
	case <-l.done:
	}
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	if err == nil {
		err = net.ErrClosed
	}
	return nil, &net.OpError{Op: "accept", Net: "udp", Addr: l.pc.LocalAddr(), Err: err}
}

// Close closes the socket and every session.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		sessions := make([]*Session, 0, len(l.sessions))
		for _, s := range l.sessions {
			sessions = append(sessions, s)
		}
		l.mu.Unlock()
		close(l.done)
		err = l.pc.Close()
		for _, s := range sessions {
			s.Close()
		}
	})
	return err
}

func (l *Listener) Addr() net.Addr { return l.pc.LocalAddr() }

// Dropped returns the datagrams dropped for want of a session (the
// table was full of answered ones) and for want of room in a session's
// queue.
func (l *Listener) Dropped() (sessions, queued int64) {
	return l.dropped.sessions.Load(), l.dropped.datagrams.Load()
}

// Evicted returns how many sessions gave their place to a new client
// (see ListenConfig.MaxSessions).
func (l *Listener) Evicted() int64 { return l.dropped.evicted.Load() }

// A Session is one client of a Listener: Read returns the datagrams it
// sent, one per call, and Write sends it one. Writes do not block (a UDP
// socket drops what it cannot send), so a write deadline has nothing to
// bound.
type Session struct {
	l     *Listener
	addr  netip.AddrPort
	raddr *net.UDPAddr
	born  uint64 // its place in the order sessions started
	q     chan []byte
	rd    netconn.Deadline
	// answered is set once the session wrote its client a datagram: a
	// two-way session is never evicted.
	answered atomic.Bool

	done chan struct{}
	once sync.Once
}

var _ net.Conn = (*Session)(nil)

func (s *Session) Read(b []byte) (int, error) {
	d, err := s.next()
	if err != nil {
		return 0, err
	}
	s.took(len(d))
	return copy(b, d), nil
}

// readBatch appends to batch the datagrams waiting, up to about max
// bytes, as Read would return them one by one; it waits as Read does
// for the first. They are the session's own: no copy.
func (s *Session) readBatch(batch [][]byte, max int) ([][]byte, error) {
	first, err := s.next()
	if err != nil {
		return batch, err
	}
	batch = append(batch, first)
	n := len(first)
	for n < max {
		select {
		case d := <-s.q:
			batch = append(batch, d)
			n += len(d)
			continue
		default:
		}
		break
	}
	s.took(n)
	return batch, nil
}

// next waits for the next datagram, as Read does, and returns it whole.
func (s *Session) next() ([]byte, error) {
	select {
	case <-s.done:
		return nil, s.opError("read", net.ErrClosed)
	default:
	}
	if s.rd.Exceeded() {
		return nil, s.opError("read", os.ErrDeadlineExceeded)
	}
	select {
	case d := <-s.q:
		return d, nil
	case <-s.done:
		return nil, s.opError("read", net.ErrClosed)
	case <-s.rd.Done():
		return nil, s.opError("read", os.ErrDeadlineExceeded)
	}
}

// took gives back the room of n bytes read from the queue.
func (s *Session) took(n int) {
	s.l.mu.Lock()
	s.l.buffered -= n
	s.l.mu.Unlock()
}

func (s *Session) Write(b []byte) (int, error) {
	select {
	case <-s.done:
		return 0, s.opError("write", net.ErrClosed)
	default:
	}
	n, err := s.l.pc.WriteToUDPAddrPort(b, s.addr)
	if err == nil && !s.answered.Load() {
		s.answered.Store(true)
	}
	return n, err
}

// Close ends the session: a later datagram from its client starts a new
// one.
func (s *Session) Close() error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	s.closeLocked()
	return nil
}

// closeLocked is Close with s.l.mu held.
func (s *Session) closeLocked() {
	s.once.Do(func() {
		close(s.done)
		if s.l.sessions[s.addr] == s {
			delete(s.l.sessions, s.addr)
		}
		for { // what waited is gone, and so is its room
			select {
			case d := <-s.q:
				s.l.buffered -= len(d)
				continue
			default:
			}
			break
		}
	})
}

func (s *Session) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "udp", Source: s.l.pc.LocalAddr(), Addr: s.raddr, Err: err}
}

func (s *Session) LocalAddr() net.Addr  { return s.l.pc.LocalAddr() }
func (s *Session) RemoteAddr() net.Addr { return s.raddr }
func (s *Session) SetDeadline(t time.Time) error {
	s.rd.Set(t)
	return nil
}
func (s *Session) SetReadDeadline(t time.Time) error {
	s.rd.Set(t)
	return nil
}
func (s *Session) SetWriteDeadline(time.Time) error { return nil }

package vio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Op is the kind of operation an Event completes.
type Op uint8

const (
	OpRead    Op = iota + 1 // PostRead, PostReadv
	OpWrite                 // PostWrite, PostWritev
	OpClose                 // PostClose, of a Sock or a Listener
	OpAccept                // PostAccept
	OpConnect               // PostConnect
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpClose:
		return "close"
	case OpAccept:
		return "accept"
	case OpConnect:
		return "connect"
	}
	return fmt.Sprintf("op %d", uint8(o))
}

// An Event is a completed operation.
type Event struct {
	Op Op
	// Sock is the Sock the operation was posted on; for OpAccept, the
	// new Sock (nil if the accept failed).
	Sock *Sock
	// Listener is the Listener of an OpAccept, or of the OpClose that
	// closed it.
	Listener *Listener
	// N is how many bytes the operation moved: on success at least the
	// minimum posted; on failure what it moved before.
	N int
	// Err is nil on success, else an *OpError.
	Err error
}

// A Set gathers Socks whose completions one or more goroutines take with
// Wait. Its methods are safe for concurrent use.
type Set struct {
	mu     sync.Mutex
	ready  []Event // completed, not yet returned by Wait, oldest first
	woken  bool    // a Wakeup not yet returned by Wait
	closed bool    // Close was called
	socks  map[*Sock]struct{}
	lns    map[*Listener]struct{}
	signal chan struct{} // holds a token while ready or woken may be set
	ops    sync.WaitGroup
}

// NewSet returns an empty Set.
func NewSet() *Set {
	return &Set{socks: map[*Sock]struct{}{}, lns: map[*Listener]struct{}{}, signal: make(chan struct{}, 1)}
}

// Add puts c in the set. The Sock owns c: PostClose, or the set's Close,
// closes it. User is the caller's, for its own bookkeeping. On a closed
// set Add fails with net.ErrClosed, and c stays the caller's.
func (s *Set) Add(c net.Conn, user any) (*Sock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("vio: add: %w", net.ErrClosed)
	}
	k := &Sock{set: s, c: c, User: user}
	s.socks[k] = struct{}{}
	return k, nil
}

// Wait returns the oldest completed operation, waiting up to timeout
// for one: a negative timeout waits for ever, 0 only looks. It returns
// ErrWoken after a Wakeup, ErrTimeout (matching os.ErrDeadlineExceeded)
// when the timeout passed, and net.ErrClosed once the set is closed.
func (s *Set) Wait(timeout time.Duration) (Event, error) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.notifyLocked() // every other waiter learns it too
			s.mu.Unlock()
			return Event{}, fmt.Errorf("vio: wait: %w", net.ErrClosed)
		case len(s.ready) > 0:
			ev := s.ready[0]
			s.ready[0] = Event{}
			s.ready = s.ready[1:]
			if len(s.ready) > 0 || s.woken {
				s.notifyLocked() // for another waiter
			}
			s.mu.Unlock()
			return ev, nil
		case s.woken:
			s.woken = false
			s.mu.Unlock()
			return Event{}, ErrWoken
		}
		s.mu.Unlock()
		if timeout == 0 {
			return Event{}, ErrTimeout
		}
		select {
		case <-s.signal:
		case <-expired:
			return Event{}, ErrTimeout
		}
	}
}

// Wakeup makes one Wait, blocked or the next, return ErrWoken (once,
// however many Wakeups came before it).
func (s *Set) Wakeup() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.woken = true
	s.notifyLocked()
}

func (s *Set) notifyLocked() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// complete queues ev for Wait; on a closed set it is dropped.
func (s *Set) complete(ev Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.ready = append(s.ready, ev)
	s.notifyLocked()
}

// Close closes every Sock and Listener of the set, interrupting what is
// posted (connects are cancelled), and waits until no operation runs;
// Waits then return net.ErrClosed, and the completions not yet taken are
// dropped. Calling it again does nothing and returns net.ErrClosed.
func (s *Set) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("vio: close: %w", net.ErrClosed)
	}
	s.closed = true
	socks, lns := s.socks, s.lns
	s.socks, s.lns = nil, nil
	s.ready = nil
	s.notifyLocked()
	s.mu.Unlock()
	var errs []error
	for k := range socks {
		if err := k.shut(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for l := range lns {
		l.mu.Lock()
		l.closing = true
		l.mu.Unlock()
		if err := l.l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	s.ops.Wait()
	return errors.Join(errs...)
}

// A Sock is a connection in a Set. It takes one read and one write in
// progress at a time; an operation frees its kind as its completion is
// queued, so the next may be posted before Wait returns that completion
// (completions of one kind keep the order of their posts).
type Sock struct {
	// User is the caller's: the Set never reads it. Set it before posting
	// on the Sock, or from the goroutine that takes its events.
	User any

	set *Set

	mu               sync.Mutex
	c                net.Conn // nil until a posted connect completes
	cancel           func()   // cancels the posted connect, if one runs
	reading, writing bool
	closing          bool
	ops              sync.WaitGroup // the read, write or connect in progress
}

// Conn returns the Sock's connection, for what vio does not do (its
// addresses, deadlines); nil until its connect completed. Reading or
// writing it while an operation is posted mixes the bytes
// unpredictably.
func (k *Sock) Conn() net.Conn {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.c
}

// shut marks the Sock closing and interrupts what runs on it: it cancels
// a connect, or closes the connection.
func (k *Sock) shut() error {
	k.mu.Lock()
	k.closing = true
	c, cancel := k.c, k.cancel
	k.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if c == nil {
		return nil
	}
	return c.Close()
}

// post starts op on its own goroutine if the Sock takes it.
func (k *Sock) post(op Op, run func() (int, error)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	busy := &k.reading
	if op == OpWrite {
		busy = &k.writing
	}
	switch {
	case k.closing:
		return &OpError{Op: op, Err: net.ErrClosed}
	case k.c == nil:
		return &OpError{Op: op, Err: ErrNotConnected}
	case *busy:
		return &OpError{Op: op, Err: ErrBusy}
	}
	// Under k.mu, so that a Set.Close past this point waits for it.
	k.set.mu.Lock()
	closed := k.set.closed
	if !closed {
		k.set.ops.Add(1)
	}
	k.set.mu.Unlock()
	if closed {
		return &OpError{Op: op, Err: net.ErrClosed}
	}
	*busy = true
	k.ops.Add(1)
	go func() {
		defer k.set.ops.Done()
		n, err := run()
		// Under k.mu: a post of the same kind sees the Sock busy until
		// this completion is queued, so completions keep the order of
		// the posts, and one made after Wait returned this event never
		// finds it busy.
		k.mu.Lock()
		*busy = false
		if err != nil && k.closing {
			err = net.ErrClosed // interrupted by PostClose, whatever the connection said
		}
		if err != nil {
			err = &OpError{Op: op, Err: err}
		}
		k.set.complete(Event{Op: op, Sock: k, N: n, Err: err})
		k.mu.Unlock()
		k.ops.Done()
	}()
	return nil
}

// PostRead posts a read into buf of at least min bytes and at most
// len(buf): it completes once min bytes have come, with what a read
// returned beyond them. progress, if not nil, is called with each
// partial count, on the operation's goroutine, before the completion.
// The peer's end of the stream completes it with io.EOF when nothing was
// read, io.ErrUnexpectedEOF when less than min was.
func (k *Sock) PostRead(buf []byte, min int, progress func(n int)) error {
	if min < 1 || min > len(buf) {
		return &OpError{Op: OpRead, Err: fmt.Errorf("%w: minimum %d for a buffer of %d bytes", ErrInvalid, min, len(buf))}
	}
	return k.post(OpRead, func() (int, error) {
		n := 0
		for n < min {
			m, err := k.c.Read(buf[n:])
			n += m
			if m > 0 && progress != nil {
				progress(m)
			}
			if err != nil {
				return n, readErr(err, n, min)
			}
		}
		return n, nil
	})
}

// PostReadv posts a read that fills bufs in order, completing once every
// one is full. progress is as for PostRead.
func (k *Sock) PostReadv(bufs [][]byte, progress func(n int)) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total == 0 {
		return &OpError{Op: OpRead, Err: fmt.Errorf("%w: no room to read into", ErrInvalid)}
	}
	return k.post(OpRead, func() (int, error) {
		n := 0
		for _, b := range bufs {
			for off := 0; off < len(b); {
				m, err := k.c.Read(b[off:])
				off += m
				n += m
				if m > 0 && progress != nil {
					progress(m)
				}
				if err != nil {
					return n, readErr(err, n, total)
				}
			}
		}
		return n, nil
	})
}

// readErr is what a read that ended with err after n of min bytes
// reports.
func readErr(err error, n, min int) error {
	if errors.Is(err, io.EOF) && n > 0 && n < min {
		return io.ErrUnexpectedEOF
	}
	return err
}

// PostWrite posts a write of buf. It completes once all of buf was
// written (a net.Conn's Write writes all or fails); progress is called
// once with the count before the completion.
func (k *Sock) PostWrite(buf []byte, progress func(n int)) error {
	if len(buf) == 0 {
		return &OpError{Op: OpWrite, Err: fmt.Errorf("%w: nothing to write", ErrInvalid)}
	}
	return k.post(OpWrite, func() (int, error) {
		n, err := k.c.Write(buf)
		if n > 0 && progress != nil {
			progress(n)
		}
		return n, err
	})
}

// PostWritev posts a write of bufs, in order, in one writev where the
// connection takes one (a TCP or unix socket). bufs is consumed, as
// net.Buffers.WriteTo does.
func (k *Sock) PostWritev(bufs net.Buffers, progress func(n int)) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total == 0 {
		return &OpError{Op: OpWrite, Err: fmt.Errorf("%w: nothing to write", ErrInvalid)}
	}
	return k.post(OpWrite, func() (int, error) {
		n, err := bufs.WriteTo(k.c)
		if n > 0 && progress != nil {
			progress(int(n))
		}
		return int(n), err
	})
}

// PostClose closes the Sock: the read and write posted on it, or its
// connect, are interrupted and complete with an error matching
// net.ErrClosed, then an OpClose event completes, with the connection's
// Close error if any. Posting on the Sock afterwards fails with
// net.ErrClosed.
func (k *Sock) PostClose() error {
	k.mu.Lock()
	if k.closing {
		k.mu.Unlock()
		return &OpError{Op: OpClose, Err: net.ErrClosed}
	}
	k.closing = true
	k.mu.Unlock()
	s := k.set
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &OpError{Op: OpClose, Err: net.ErrClosed}
	}
	delete(s.socks, k)
	s.ops.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.ops.Done()
		err := k.shut()
		k.ops.Wait() // the interrupted operations complete first
		if err != nil {
			err = &OpError{Op: OpClose, Err: err}
		}
		s.complete(Event{Op: OpClose, Sock: k, Err: err})
	}()
	return nil
}

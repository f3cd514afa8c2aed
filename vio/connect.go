package vio

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// A Listener is a net.Listener in a Set, the seed's listen: a program
// posts its accepts one at a time, and takes each new connection as an
// OpAccept event carrying the new Sock.
type Listener struct {
	// User is the caller's: the Set never reads it.
	User any

	set *Set
	l   net.Listener

	mu        sync.Mutex
	accepting bool
	closing   bool
	ops       sync.WaitGroup // the accept in progress
}

// AddListener puts l in the set, as the seed's listen makes a listener
// of a set; l may be a TCP listener, a vlink listener (whose accepts run
// the listener's side of the stacks), any net.Listener. The Listener owns
// l: its PostClose, or the set's Close, closes it. On a closed set
// AddListener fails with net.ErrClosed, and l stays the caller's.
func (s *Set) AddListener(l net.Listener, user any) (*Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("vio: add listener: %w", net.ErrClosed)
	}
	ln := &Listener{set: s, l: l, User: user}
	s.lns[ln] = struct{}{}
	return ln, nil
}

// Addr returns the address l listens on.
func (l *Listener) Addr() net.Addr { return l.l.Addr() }

// PostAccept posts an accept: it completes as an OpAccept event whose
// Sock is the new connection's, in the set, with user as its User; or,
// if the accept failed, with no Sock and an *OpError (net.ErrClosed once
// the Listener is closed). One accept is posted at a time: another fails
// with ErrBusy until this one's event is queued.
func (l *Listener) PostAccept(user any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closing:
		return &OpError{Op: OpAccept, Err: net.ErrClosed}
	case l.accepting:
		return &OpError{Op: OpAccept, Err: ErrBusy}
	}
	s := l.set
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.ops.Add(1)
	}
	s.mu.Unlock()
	if closed {
		return &OpError{Op: OpAccept, Err: net.ErrClosed}
	}
	l.accepting = true
	l.ops.Add(1)
	go func() {
		defer s.ops.Done()
		c, err := l.l.Accept()
		// Under l.mu, as for a Sock's operations: the next accept may be
		// posted once this completion is queued, and a PostClose's event
		// comes after it.
		l.mu.Lock()
		l.accepting = false
		if err != nil {
			if l.closing {
				err = net.ErrClosed // interrupted by PostClose, whatever the listener said
			}
			s.complete(Event{Op: OpAccept, Listener: l, Err: &OpError{Op: OpAccept, Err: err}})
		} else {
			s.completeNew(Event{Op: OpAccept, Listener: l}, &Sock{set: s, c: c, User: user})
		}
		l.mu.Unlock()
		l.ops.Done()
	}()
	return nil
}

// PostClose closes the Listener: a posted accept is interrupted and
// completes with an error matching net.ErrClosed, then an OpClose event
// with the Listener completes. The connections it accepted stay open.
// Posting an accept afterwards fails with net.ErrClosed.
func (l *Listener) PostClose() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return &OpError{Op: OpClose, Err: net.ErrClosed}
	}
	l.closing = true
	l.mu.Unlock()
	s := l.set
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return &OpError{Op: OpClose, Err: net.ErrClosed}
	}
	delete(s.lns, l)
	s.ops.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.ops.Done()
		err := l.l.Close()
		l.ops.Wait() // the interrupted accept completes first
		if err != nil {
			err = &OpError{Op: OpClose, Err: err}
		}
		s.complete(Event{Op: OpClose, Listener: l, Err: err})
	}()
	return nil
}

// completeNew puts k in the set and queues ev, which carries it, at
// once, so that a Close of the set closes k or it was closed already:
// then k's connection is closed and ev dropped.
func (s *Set) completeNew(ev Event, k *Sock) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		k.c.Close()
		return
	}
	s.socks[k] = struct{}{}
	ev.Sock = k
	s.ready = append(s.ready, ev)
	s.notifyLocked()
	s.mu.Unlock()
}

// A ContextDialer dials with a context: net.Dialer, vlink.Dialer and
// every layer.ContextDialer are ones.
type ContextDialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// PostConnect posts a dial of address through d (a zero net.Dialer if d
// is nil) and returns its Sock at once, as the seed's post_connect does;
// user is the Sock's User. The dial completes as an OpConnect event on
// that Sock; reads and writes may be posted on it from then on (before,
// they fail with ErrNotConnected). PostClose, or the set's Close, cancels
// the dial: it completes with an error matching net.ErrClosed, then the
// close. A dial that fails completes with an *OpError and leaves the
// Sock closed: posts on it fail with net.ErrClosed, and no OpClose
// follows.
func (s *Set) PostConnect(d ContextDialer, network, address string, user any) (*Sock, error) {
	if d == nil {
		d = &net.Dialer{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Sock{set: s, User: user, cancel: cancel}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return nil, &OpError{Op: OpConnect, Err: net.ErrClosed}
	}
	s.socks[k] = struct{}{}
	s.ops.Add(1)
	k.ops.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.ops.Done()
		c, err := d.DialContext(ctx, network, address)
		cancel()
		k.mu.Lock()
		k.cancel = nil
		if k.closing {
			if err == nil {
				c.Close() // the close came first: the connection is not the program's
			}
			err = net.ErrClosed
		}
		if err == nil {
			k.c = c
			s.complete(Event{Op: OpConnect, Sock: k})
		} else {
			k.closing = true
			s.forget(k)
			s.complete(Event{Op: OpConnect, Sock: k, Err: &OpError{Op: OpConnect, Err: err}})
		}
		k.mu.Unlock()
		k.ops.Done()
	}()
	return k, nil
}

// forget takes k out of the set: its connect failed.
func (s *Set) forget(k *Sock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.socks != nil {
		delete(s.socks, k)
	}
}

package netconn

import (
	"errors"
	"net"
	"sync"
)

// Merge returns a listener that accepts from all of ls: a server's TCP
// port and its shared-memory listener, say, or its node's connections
// through a vlink network. Its Addr is the first's. An error of one
// listener is returned by Accept as it comes, and that listener is
// accepted from again afterwards unless it is closed (net.ErrClosed),
// so a caller that retries temporary failures (running out of
// descriptors) keeps every listener. Close closes them all.
func Merge(ls ...net.Listener) net.Listener {
	m := &merged{ls: ls, conns: make(chan net.Conn), errs: make(chan error), done: make(chan struct{})}
	for _, l := range ls {
		go m.accept(l)
	}
	return m
}

type merged struct {
	ls    []net.Listener
	conns chan net.Conn
	errs  chan error
	done  chan struct{}
	once  sync.Once
}

func (m *merged) accept(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			select {
			case m.errs <- err:
			case <-m.done:
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		select {
		case m.conns <- c:
		case <-m.done:
			c.Close()
			return
		}
	}
}

// Accept returns the next connection, or the next error, of any of the
// listeners.
func (m *merged) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case err := <-m.errs:
		return nil, err
	case <-m.done:
		return nil, &net.OpError{Op: "accept", Net: m.Addr().Network(), Addr: m.Addr(), Err: net.ErrClosed}
	}
}

func (m *merged) Close() error {
	m.once.Do(func() { close(m.done) })
	var errs []error
	for _, l := range m.ls {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

func (m *merged) Addr() net.Addr { return m.ls[0].Addr() }

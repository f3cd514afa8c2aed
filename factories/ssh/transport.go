package ssh

import (
	"errors"
	"net"
	"sync"
)

// transport is the connection under an SSH client. It remembers why it
// failed, so that a tunnel whose channel reads EOF can tell the server's
// end of stream from a lost connection: x/crypto/ssh ends every channel
// with EOF when its connection breaks.
type transport struct {
	net.Conn
	framer  *framer // nil: writes pass through
	mu      sync.Mutex
	err     error // why it ended, closing included
	ioErr   error // the first I/O error before it was closed
	closed  bool
	done    chan struct{}
	doneOne sync.Once
}

func newTransport(c net.Conn) *transport { return &transport{Conn: c, done: make(chan struct{})} }

func (t *transport) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if err != nil {
		t.ioFailed(err)
	}
	return n, err
}

func (t *transport) Write(p []byte) (int, error) {
	var n int
	var err error
	if t.framer != nil {
		n, err = t.framer.write(p)
	} else {
		n, err = t.Conn.Write(p)
	}
	if err != nil {
		t.ioFailed(err)
	}
	return n, err
}

func (t *transport) Close() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.setLost(net.ErrClosed)
	return t.Conn.Close()
}

// ioFailed records an I/O error, unless it only reports our own Close.
func (t *transport) ioFailed(err error) {
	t.mu.Lock()
	if !t.closed && t.ioErr == nil {
		t.ioErr = err
	}
	t.mu.Unlock()
	t.setLost(err)
}

// failed returns the first I/O error seen before Close.
func (t *transport) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ioErr
}

// setLost records the first reason the connection ended.
func (t *transport) setLost(err error) {
	if err == nil {
		err = errors.New("closed")
	}
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
	t.doneOne.Do(func() { close(t.done) })
}

func (t *transport) lost() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

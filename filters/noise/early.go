package noise

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Early data (layer.Handshake.Early): on the dialer's side, a first
// flight may carry the connection's first bytes in its first message, so
// that a request reaches the listener's target with the hello and its
// answer comes back with the listener's: two round trips to the first
// byte of the answer, TCP's handshake included, as for TCP alone. The
// message's payload is sealed under the pre-shared key and the dialer's
// ephemeral key (and, with NKpsk0, the listener's static key), so only
// the listener reads it; what keeps a recorded one from reaching the
// target twice is the listener's (vlink's replay.go).
//
// The connection returned then has not sent anything: it keeps what is
// written, up to maxEarly bytes, until Handshake sends the hello and the
// first message with it, at the latest at the first Read or at a Write
// that would not fit. If the listener does not take the data (it answers
// the long way, or its answer says it dropped them), the bytes go again
// as records once the handshake is done: the stream is the same either
// way, only later.

// maxEarly is the most early data a first message carries: Noise's
// largest message, less the ephemeral key and the payload's tag.
const maxEarly = maxRecord - dhLen - tagSize

// early is a dialer's handshake that waits for the first bytes written.
type early struct {
	mu    sync.Mutex
	state atomic.Int32 // earlyPending, then earlyDone or earlyFailed
	hs    layer.Handshake
	buf   []byte // written while pending: the first message's payload
	err   error  // why it failed, once earlyFailed
}

const (
	earlyPending int32 = iota
	earlyDone          // the handshake is done: the connection is as any other
	earlyFailed        // the handshake failed, or the connection closed before it
)

var _ layer.EarlyConn = (*conn)(nil)

func newEarlyConn(c net.Conn, hs layer.Handshake) *conn {
	cn := newConn(c, nil, nil)
	cn.early = &early{hs: hs}
	return cn
}

// hold keeps p for the first message and reports whether it did: not
// once the handshake has run, nor if p does not fit beside what is held.
func (e *early) hold(p []byte) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state.Load() != earlyPending || len(e.buf)+len(p) > maxEarly {
		return false
	}
	e.buf = append(e.buf, p...)
	return true
}

// Handshake sends the hello and the first message with what was written
// so far, and reads the answers. It runs once: later calls return its
// error. For a connection that did not wait for its first bytes it does
// nothing.
func (c *conn) Handshake() error {
	e := c.early
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state.Load() {
	case earlyDone:
		return nil
	case earlyFailed:
		return e.err
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "handshake", Net: "noise", Source: c.c.LocalAddr(), Addr: c.c.RemoteAddr(), Err: err}
	}
	send, recv, taken, err := firstFlight(c.c, e.hs, e.buf, opErr)
	if err != nil {
		e.err = err
		e.state.Store(earlyFailed)
		return err
	}
	c.send, c.recv = send, recv
	held := e.buf
	e.buf, e.hs = nil, layer.Handshake{}
	e.state.Store(earlyDone)
	if !taken && len(held) > 0 {
		// The listener dropped them: they go as the first records.
		if _, err := c.Write(held); err != nil {
			return err
		}
	}
	return nil
}

// ready runs the handshake if it has not run, for Read, Write and
// CloseWrite, which need it done.
func (c *conn) ready() error {
	if e := c.early; e != nil && e.state.Load() != earlyDone {
		return c.Handshake()
	}
	return nil
}

// abandon ends a connection whose handshake has not run (it sent
// nothing) and reports whether it did; Close and Abort then close the
// connection below instead of ending a stream that never began.
func (c *conn) abandon() bool {
	e := c.early
	if e == nil || e.state.Load() == earlyDone {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state.Load() {
	case earlyDone:
		return false
	case earlyPending:
		e.err = c.opErr("write", net.ErrClosed)
		e.buf = nil
		e.state.Store(earlyFailed)
	}
	return true
}

package quic

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// ErrReset is matched when the peer reset the stream (its Abort, or its
// Close with this side still sending): the stream failed, it did not end.
// It matches syscall.ECONNRESET too, as a TCP connection's reset does.
var ErrReset = errors.New("quic: stream reset by peer")

// ErrWriteClosed is matched by a write after CloseWrite.
var ErrWriteClosed = errors.New("quic: write after CloseWrite")

// conn is one stream as a net.Conn.
type conn struct {
	s    *quic.Stream
	p    *path
	once sync.Once // gives the path's hold back

	// wmu serializes Write, CloseWrite and Close's FIN: quic-go wants no
	// Close of a stream while a Write runs.
	wmu     sync.Mutex
	wclosed bool // under wmu
	closed  atomic.Bool
	// receipted: the peer was sent the receipt of this stream's data
	// (vlink/2), or needs none.
	receipted atomic.Bool

	// dq is the stream's queue of QUIC datagrams (datagram.go); nil when
	// the path carries none. dmu guards dbuf, the frame being sent.
	dq   *dqueue
	dmu  sync.Mutex
	dbuf []byte
}

var (
	_ net.Conn            = (*conn)(nil)
	_ netconn.Aborter     = (*conn)(nil)
	_ layer.ChannelBinder = (*conn)(nil)
)

func newConn(s *quic.Stream, p *path) *conn {
	p.rc.track(s.StreamID())
	c := &conn{s: s, p: p}
	if p.dm != nil {
		c.dq = p.dm.register(s.StreamID())
	}
	return c
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.s.Read(b)
	if err == io.EOF {
		c.receipt()
	} else if err != nil {
		err = c.opError("read", err)
	}
	return n, err
}

// receipt tells the peer, once, that this side is done reading the
// stream: read to its end, or closed.
func (c *conn) receipt() {
	if !c.receipted.Swap(true) {
		c.p.rc.send(c.s.StreamID())
	}
}

// finWrite sends the stream's FIN, under wmu: the peer's receipt of it
// is awaited at exit.
func (c *conn) finWrite() error {
	c.wclosed = true
	err := c.s.Close()
	c.p.rc.finished(c.s.StreamID())
	return err
}

// resetWrite resets the stream's sending side: nothing is awaited.
func (c *conn) resetWrite(code quic.StreamErrorCode) {
	c.s.CancelWrite(code)
	c.p.rc.dropped(c.s.StreamID())
}

func (c *conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	if c.wclosed {
		return 0, c.opError("write", ErrWriteClosed)
	}
	n, err := c.s.Write(b)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

// CloseWrite sends the stream's FIN after what was written; reading goes on.
func (c *conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return c.opError("close", net.ErrClosed)
	}
	if c.wclosed {
		return nil
	}
	return c.finWrite()
}

// Close ends the stream: the FIN after what was written, and the read
// side stopped (the peer's further writes fail). A Close while a Write
// is blocked resets the stream instead, so the peer never takes the cut
// stream for a whole one. Close does not wait for the peer; CloseAll
// does (see the package comment).
func (c *conn) Close() error {
	if c.closed.Swap(true) {
		return c.opError("close", net.ErrClosed)
	}
	if c.wmu.TryLock() {
		if !c.wclosed {
			c.finWrite()
		}
		c.wmu.Unlock()
	} else {
		c.resetWrite(codeClosed)
	}
	c.s.CancelRead(codeClosed)
	c.receipt()
	c.dropDatagrams()
	c.once.Do(c.p.release)
	return nil
}

// Abort resets the stream both ways: the peer's reads fail with
// ErrReset rather than end, and nothing waits for the peer.
func (c *conn) Abort() error {
	if c.closed.Swap(true) {
		return c.opError("close", net.ErrClosed)
	}
	c.resetWrite(codeAbort)
	c.s.CancelRead(codeAbort)
	c.receipt()
	c.dropDatagrams()
	c.once.Do(c.p.release)
	return nil
}

// dropDatagrams ends the stream's datagram queue: later datagrams for
// it are dropped, a ReceiveDatagram returns.
func (c *conn) dropDatagrams() {
	if c.dq != nil {
		c.p.dm.unregister(c.s.StreamID())
	}
}

// ChannelBinding returns the TLS exporter of the stream's QUIC
// connection (see the package comment).
func (c *conn) ChannelBinding() []byte { return c.p.binding }

func (c *conn) LocalAddr() net.Addr  { return c.p.qc.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.p.qc.RemoteAddr() }

func (c *conn) SetDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opError("set deadline", net.ErrClosed)
	}
	return c.s.SetDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opError("set deadline", net.ErrClosed)
	}
	return c.s.SetReadDeadline(t)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opError("set deadline", net.ErrClosed)
	}
	return c.s.SetWriteDeadline(t)
}

// opError names the hop, and says what a stream error means here: the
// peer's reset is ErrReset; this side's own cancel follows its Close or
// Abort, so it is net.ErrClosed. Errors of the QUIC connection (the
// path went silent: *quic.IdleTimeoutError; the peer closed it:
// *quic.ApplicationError) stay as quic-go gives them.
func (c *conn) opError(op string, err error) error {
	var se *quic.StreamError
	switch {
	case errors.As(err, &se) && se.Remote:
		err = &resetError{se}
	case errors.As(err, &se), c.closed.Load() && !errors.Is(err, net.ErrClosed):
		err = net.ErrClosed
	}
	return &net.OpError{Op: op, Net: "quic", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// resetError is a reset by the peer: ErrReset, with quic-go's error inside.
type resetError struct{ se *quic.StreamError }

func (e *resetError) Error() string        { return ErrReset.Error() + " (" + e.se.Error() + ")" }
func (e *resetError) Is(target error) bool { return target == ErrReset || target == syscall.ECONNRESET }
func (e *resetError) Unwrap() error        { return e.se }

package noise

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// Buffers come from pools and are held only while they hold bytes: wire
// bytes read ahead (and records decrypted in place), records being
// written.
const (
	// readBufSize is what a read asks the connection below for: a few
	// records at a time, fewer system calls.
	readBufSize = 4 * (headerSize + maxRecord)
	// writeBatch is the most records one write to the connection below
	// carries.
	writeBatch  = 4
	writeBufCap = writeBatch * (headerSize + maxRecord)
)

var (
	readPool  = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}
	writePool = sync.Pool{New: func() any { b := make([]byte, 0, writeBufCap); return &b }}
)

// errWriteShut is returned by writes after CloseWrite.
var errWriteShut = fmt.Errorf("%w: write side shut down", net.ErrClosed)

// conn seals what it writes into records and opens the records it reads.
// Reads and writes have separate state and locks, so one of each may run
// at a time; Close takes neither and unblocks both through the
// connection below.
type conn struct {
	c      net.Conn
	closed atomic.Bool

	rmu   sync.Mutex // guards the read side (read.go)
	recv  *cipherState
	hdr   header  // the current record's header
	hdrN  int     // bytes of the next header read so far
	inRec bool    // hdr is complete, its body not yet opened
	rbuf  *[]byte // wire bytes read ahead, (*rbuf)[r:w] not yet parsed
	r, w  int
	plain []byte // opened bytes not yet returned, inside *rbuf
	rerr  error  // sticky: io.EOF or a failure of the stream

	wmu      sync.Mutex // guards the write side (write.go)
	send     *cipherState
	tail     *[]byte // holds tailData
	tailData []byte  // the rest of records a deadline cut, sent before anything else
	werr     error   // sticky: a write failed and the stream is broken
	wshut    bool    // the end record was written (or is in tail)
	shutDone bool    // and c was shut down
}

var (
	_ net.Conn        = (*conn)(nil)
	_ closeWriter     = (*conn)(nil)
	_ netconn.Aborter = (*conn)(nil)
)

type closeWriter interface{ CloseWrite() error }

func newConn(c net.Conn, send, recv *cipherState) *conn {
	return &conn{c: c, send: send, recv: recv}
}

func (c *conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "noise", Source: c.c.LocalAddr(), Addr: c.c.RemoteAddr(), Err: err}
}

// CloseWrite shuts down the writing side: it sends the end record, after
// which the peer reads io.EOF, and shuts down the writing side of the
// connection below if it can. Calling it again does nothing.
func (c *conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		c.dropTail()
		return c.opErr("close", net.ErrClosed)
	}
	if err := c.sendEnd(); err != nil {
		return err
	}
	if !c.shutDone {
		c.shutDone = true
		if cw, ok := c.c.(closeWriter); ok {
			return cw.CloseWrite()
		}
	}
	return nil
}

// sendEnd sends what a deadline left of the last records and the end
// record, unless it was sent. It holds wmu.
func (c *conn) sendEnd() error {
	if c.werr != nil {
		return c.werr
	}
	if !c.wshut {
		if err := c.flushTail(); err != nil {
			return err
		}
		fb := writePool.Get().(*[]byte)
		buf, err := c.seal((*fb)[:0], recEnd, nil)
		if err != nil {
			writePool.Put(fb)
			c.werr = c.opErr("write", err)
			return c.werr
		}
		sent, err := c.sendBuf(fb, buf)
		c.wshut = sent
		if err != nil {
			return err
		}
	}
	return c.flushTail()
}

// closeLinger bounds how long a closed connection still tries to send
// its end record to a peer that does not read.
const closeLinger = 10 * time.Second

// Close closes the connection as a socket's close does: unless the
// writing side was shut down already, the end record is still sent, in
// the background for up to closeLinger, so the peer reads what was
// written and then io.EOF. If a Write is in progress or failed, the
// stream is cut short and no end record is sent: the peer's Read fails
// with io.ErrUnexpectedEOF. Close unblocks any Read or Write at once;
// later calls return an error matching net.ErrClosed.
func (c *conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	// A Write in progress holds wmu: Close must not wait for it.
	if c.wmu.TryLock() {
		if !c.wshut && c.werr == nil {
			netconn.InterruptRead(c.c)
			go c.linger()
			return nil
		}
		c.dropTail()
		c.wmu.Unlock()
	}
	return c.closeBelow(c.c.Close())
}

// linger sends the end record, then closes the connection below. It
// holds wmu, which Close took.
func (c *conn) linger() {
	defer c.wmu.Unlock()
	c.c.SetWriteDeadline(time.Now().Add(closeLinger))
	c.sendEnd()
	c.dropTail()
	c.closeBelow(c.c.Close())
}

// Abort closes the connection without its end record and aborts the one
// below (netconn.Abort), so the peer sees a failure, never an end of
// stream.
func (c *conn) Abort() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	if c.wmu.TryLock() {
		c.dropTail()
		c.wmu.Unlock()
	}
	return c.closeBelow(netconn.Abort(c.c))
}

// closeBelow returns the read buffer once the connection below is
// closed, unless a Read holds it: that one returns it when it sees the
// close.
func (c *conn) closeBelow(err error) error {
	if c.rmu.TryLock() {
		c.releaseRead()
		c.rmu.Unlock()
	}
	return err
}

// NetConn returns the connection below, as tls.Conn.NetConn does, for
// what reads its state (the kernel's byte counts of the socket at the
// bottom, netconn.TCPBelow). Reading or writing it would corrupt the
// records.
func (c *conn) NetConn() net.Conn { return c.c }

func (c *conn) LocalAddr() net.Addr                { return c.c.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr               { return c.c.RemoteAddr() }
func (c *conn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

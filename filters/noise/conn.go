package noise

import (
	"net"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/framed"
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

// conn seals what it writes into records and opens the records it reads.
// Reads and writes have separate state and locks (ends.LockRead,
// ends.LockWrite), so one of each may run at a time; its ends (Close,
// Abort, CloseWrite) are framed.Ends', with the end record as the end
// marker.
type conn struct {
	c    net.Conn
	ends framed.Ends

	// The read side (read.go), under ends.LockRead.
	recv  *cipherState
	hdr   header  // the current record's header
	hdrN  int     // bytes of the next header read so far
	inRec bool    // hdr is complete, its body not yet opened
	rbuf  *[]byte // wire bytes read ahead, (*rbuf)[r:w] not yet parsed
	r, w  int
	plain []byte // opened bytes not yet returned, inside *rbuf
	rerr  error  // sticky: io.EOF or a failure of the stream

	// The write side (write.go), under ends.LockWrite.
	send     *cipherState
	tail     *[]byte // holds tailData
	tailData []byte  // the rest of records a deadline cut, sent before anything else

	// early, on a dialer's connection made to wait for its first bytes
	// (early.go), until its handshake is done: send and recv are nil
	// until then. Nil on any other.
	early *early
}

var (
	_ net.Conn        = (*conn)(nil)
	_ closeWriter     = (*conn)(nil)
	_ netconn.Aborter = (*conn)(nil)
	_ framed.Framing  = framing{}
)

type closeWriter interface{ CloseWrite() error }

func newConn(c net.Conn, send, recv *cipherState) *conn {
	cn := &conn{c: c, send: send, recv: recv}
	cn.ends.Init(c, "noise", framing{cn})
	return cn
}

func (c *conn) opErr(op string, err error) error { return c.ends.OpError(op, err) }

// CloseWrite shuts down the writing side: it sends the end record, after
// which the peer reads io.EOF, and shuts down the writing side of the
// connection below if it can (framed.Ends.CloseWrite).
func (c *conn) CloseWrite() error {
	if err := c.ready(); err != nil {
		return err
	}
	return c.ends.CloseWrite()
}

// Close closes the connection as a socket's close does: the end record is
// still sent, in the background for up to framed.CloseLinger, unless a
// Write is in progress or failed, which cuts the stream short; after the
// peer's end record, it reads what the layer below still sends
// (framed.Ends.Close).
func (c *conn) Close() error {
	if c.abandon() {
		return c.c.Close()
	}
	return c.ends.Close()
}

// Abort closes the connection without its end record and aborts the one
// below (netconn.Abort), so the peer sees a failure, never an end of
// stream.
func (c *conn) Abort() error {
	if c.abandon() {
		return c.c.Close()
	}
	return c.ends.Abort()
}

// framing is the layer's part of its ends: the end record, the tail a
// deadline left, the read buffer.
type framing struct{ c *conn }

func (f framing) WriteEnd() (bool, error) {
	c := f.c
	fb := writePool.Get().(*[]byte)
	buf, err := c.seal((*fb)[:0], recEnd, nil)
	if err != nil {
		writePool.Put(fb)
		return false, c.ends.FailWrite(c.opErr("write", err))
	}
	return c.sendBuf(fb, buf)
}

func (f framing) FlushTail() error { return f.c.flushTail() }
func (f framing) DropTail()        { f.c.dropTail() }
func (f framing) ReleaseRead()     { f.c.releaseRead() }

// NetConn returns the connection below, as tls.Conn.NetConn does, for
// what reads its state (the kernel's byte counts of the socket at the
// bottom, netconn.TCPBelow). Reading or writing it would corrupt the
// records.
func (c *conn) NetConn() net.Conn { return c.c }

func (c *conn) LocalAddr() net.Addr  { return c.c.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.c.RemoteAddr() }

// The read deadline goes through ends: once the peer's end marker is
// read, it no longer reaches below (framed.Ends.SetReadDeadline).
func (c *conn) SetDeadline(t time.Time) error      { return c.ends.SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.ends.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

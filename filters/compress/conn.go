package compress

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// Writer tuning.
const (
	// minCompress is the smallest block worth compressing: below it the
	// codec's own framing eats the gain.
	minCompress = 64
	// minSavingShift: a compressed block must be at least 1/16 shorter
	// than the raw one, or it is sent raw and spares the reader a decode.
	minSavingShift = 4
	// maxBackoff caps how many blocks go raw between two attempts on
	// incompressible data: 64 blocks of 128 KiB probe again every 8 MiB.
	maxBackoff = 64
)

// Buffers come from pools and are held only while a frame is in flight:
// decoded blocks, wire bytes read ahead, frames being written.
var (
	blockPool = sync.Pool{New: func() any { b := make([]byte, MaxBlock); return &b }}
	readPool  = sync.Pool{New: func() any { b := make([]byte, readAhead+headerSize); return &b }}
	framePool = sync.Pool{New: func() any { b := make([]byte, headerSize+payloadRoom); return &b }}
)

// errWriteShut is returned by writes after CloseWrite.
var errWriteShut = fmt.Errorf("%w: write side shut down", net.ErrClosed)

// conn frames and compresses what it writes and decodes what it reads.
// Reads and writes have separate state and locks, so one of each may run
// at a time; Close takes neither and unblocks both through the
// underlying connection.
type conn struct {
	c        net.Conn
	name     string
	codec    blockCodec       // a fixed layer's codec; nil for auto
	dec      *decoders        // the codecs the reader accepts
	rungs    []rung           // auto's ladder; nil for a fixed layer
	cnt      *counters        // the layer's, for Stats
	rungUsed []*atomic.Uint64 // auto's: bytes written at each rung, for AdaptiveStats
	vectored bool             // c writes a net.Buffers with one writev
	closed   atomic.Bool
	// peerEnded: the peer's end frame was read. What it sends after (the
	// end of the layer below) is read before closing: see drainClose.
	peerEnded atomic.Bool

	rmu     sync.Mutex // guards the read side (read.go)
	hdr     header     // the current frame's header
	hdrN    int        // bytes of the next header read so far
	rawLeft int        // bytes of the current raw frame not yet read
	inComp  bool       // hdr is a compressed frame's, its payload not yet decoded
	rbuf    *[]byte    // wire bytes read ahead, (*rbuf)[r:w] not yet parsed
	r, w    int
	outBuf  *[]byte // holds out
	out     []byte  // decoded bytes not yet returned
	rerr    error   // sticky: io.EOF or a failure of the stream

	wmu      sync.Mutex  // guards the write side (write.go)
	tail     *[]byte     // holds tailData
	tailData []byte      // the rest of a frame a deadline cut, sent before anything else
	skip     int         // blocks to send raw before trying to compress again
	backoff  int         // skip after the next failed attempt
	werr     error       // sticky: a write failed and the stream is broken
	ctrl     *controller // auto's, made by the first Write
	wshut    bool        // the end frame was written (or is in tail)
	shutDone bool        // and c was shut down
}

var (
	_ net.Conn        = (*conn)(nil)
	_ io.WriterTo     = (*conn)(nil)
	_ closeWriter     = (*conn)(nil)
	_ netconn.Aborter = (*conn)(nil)
)

type closeWriter interface{ CloseWrite() error }

// newConn returns a fixed layer's connection.
func newConn(c net.Conn, name string, codec blockCodec) *conn {
	return newConnDec(c, name, codec, fixedDecoders[name])
}

func newConnDec(c net.Conn, name string, codec blockCodec, dec *decoders) *conn {
	cn := &conn{c: c, name: name, codec: codec, dec: dec, cnt: layerCounters[name]}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		cn.vectored = true
	}
	return cn
}

func (c *conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: c.name, Source: c.c.LocalAddr(), Addr: c.c.RemoteAddr(), Err: err}
}

// CloseWrite shuts down the writing side: it sends an end frame, after
// which the peer reads io.EOF, and shuts down the underlying connection's
// writing side if it can. Over a connection that cannot half-close, the
// end frame alone gives the peer its EOF. Calling it again does nothing.
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

// sendEnd sends what a deadline left of the last frame and the end
// frame, unless it was sent. It holds wmu.
func (c *conn) sendEnd() error {
	if c.werr != nil {
		return c.werr
	}
	if !c.wshut {
		if err := c.flushTail(); err != nil {
			return err
		}
		fb := framePool.Get().(*[]byte)
		(*header)(*fb).set(frameEnd, 0, 0)
		sent, err := c.send(fb, headerSize)
		c.wshut = sent
		if sent {
			c.cnt.sent.Add(headerSize)
		}
		if err != nil {
			return err
		}
	}
	return c.flushTail()
}

// closeLinger bounds how long a closed connection still tries to send
// its end frame to a peer that does not read.
const closeLinger = 10 * time.Second

// After the peer's end frame, a close reads what still comes from the
// connection below for up to endDrain, and at most maxEndDrain bytes.
const (
	endDrain    = time.Second
	maxEndDrain = 64 << 10
)

// Close closes the connection as a socket's close does: unless the
// writing side was shut down already, the end frame is still sent, in the
// background for up to closeLinger, so the peer reads what was written
// and then io.EOF. If a Write is in progress or failed, the stream is cut
// short and no end frame is sent: the peer's Read fails with
// io.ErrUnexpectedEOF. Close unblocks any Read or Write at once; later
// calls return an error matching net.ErrClosed.
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
		if c.peerEnded.Load() {
			go func() { c.closeBelow(c.drainClose()) }()
			return nil
		}
	}
	return c.closeBelow(c.c.Close())
}

// linger sends the end frame, then closes the connection below. It holds
// wmu, which Close took.
func (c *conn) linger() {
	defer c.wmu.Unlock()
	c.c.SetWriteDeadline(time.Now().Add(closeLinger))
	c.sendEnd()
	c.dropTail()
	if c.peerEnded.Load() {
		c.closeBelow(c.drainClose())
		return
	}
	c.closeBelow(c.c.Close())
}

// drainClose closes the connection below once it has read what the peer
// sent after its end frame: the end of the layer below (noise's end
// record), which its CloseWrite sends a moment later. A socket closed
// with bytes unread is reset by the kernel, which throws away what it had
// not sent yet: the peer would lose the end of what we wrote.
func (c *conn) drainClose() error {
	c.c.SetReadDeadline(time.Now().Add(endDrain))
	var buf [512]byte
	for n := 0; n < maxEndDrain; {
		k, err := c.c.Read(buf[:])
		n += k
		if err != nil {
			break
		}
	}
	return c.c.Close()
}

// Abort closes the connection without its end frame and aborts the one
// below (netconn.Abort), so the peer sees a failure, never an end of
// stream: relays and multi-link layers call it when the other side of a
// stream failed.
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

// closeBelow returns the read buffers once the connection below is
// closed, unless a Read holds them: that one returns them when it sees
// the close.
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
// frames.
func (c *conn) NetConn() net.Conn { return c.c }

func (c *conn) LocalAddr() net.Addr                { return c.c.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr               { return c.c.RemoteAddr() }
func (c *conn) SetDeadline(t time.Time) error      { return c.c.SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.c.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

package compress

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/framed"
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

// conn frames and compresses what it writes and decodes what it reads.
// Reads and writes have separate state and locks (ends.LockRead,
// ends.LockWrite), so one of each may run at a time; its ends (Close,
// Abort, CloseWrite) are framed.Ends', with the end frame as the end
// marker.
type conn struct {
	c        net.Conn
	ends     framed.Ends
	codec    blockCodec       // a fixed layer's codec; nil for auto
	dec      *decoders        // the codecs the reader accepts
	rungs    []rung           // auto's ladder; nil for a fixed layer
	cnt      *counters        // the layer's, for Stats
	rungUsed []*atomic.Uint64 // auto's: bytes written at each rung, for AdaptiveStats
	vectored bool             // c writes a net.Buffers with one writev
	raw      syscall.RawConn  // c's socket, when payloads may be spliced to and from it (splice_linux.go); else nil

	// The read side (read.go), under ends.LockRead.
	hdr     header  // the current frame's header
	hdrN    int     // bytes of the next header read so far
	rawLeft int     // bytes of the current raw frame not yet read
	inComp  bool    // hdr is a compressed frame's, its payload not yet decoded
	rbuf    *[]byte // wire bytes read ahead, (*rbuf)[r:w] not yet parsed
	r, w    int
	outBuf  *[]byte // holds out
	out     []byte  // decoded bytes not yet returned
	rerr    error   // sticky: io.EOF or a failure of the stream

	peekHdr func(fd uintptr) bool // nextRawFrame's read (splice_linux.go),
	peekN   int                   // its count
	peekErr error                 // and error

	// The write side (write.go), under ends.LockWrite.
	tail      *[]byte               // holds tailData
	tailData  []byte                // the rest of a frame a deadline cut, sent before anything else
	skip      int                   // blocks to send raw before trying to compress again
	backoff   int                   // skip after the next failed attempt
	ctrl      *controller           // auto's, made by the first Write
	shdr      header                // a spliced frame's header (splice_linux.go)
	rfSrc     net.Conn              // the source of the last ReadFrom that splices,
	rfRaw     syscall.RawConn       // and its socket
	readFn    func(fd uintptr) bool // readNow's read (splice_linux.go),
	readBuf   []byte                // its buffer,
	readN     int                   // count
	readErrno error                 // and error
}

var (
	_ net.Conn        = (*conn)(nil)
	_ io.WriterTo     = (*conn)(nil)
	_ io.ReaderFrom   = (*conn)(nil)
	_ closeWriter     = (*conn)(nil)
	_ netconn.Aborter = (*conn)(nil)
	_ framed.Framing  = framing{}
)

type closeWriter interface{ CloseWrite() error }

// newConn returns a fixed layer's connection.
func newConn(c net.Conn, name string, codec blockCodec) *conn {
	return newConnDec(c, name, codec, fixedDecoders[name])
}

func newConnDec(c net.Conn, name string, codec blockCodec, dec *decoders) *conn {
	cn := &conn{c: c, codec: codec, dec: dec, cnt: layerCounters[name]}
	cn.ends.Init(c, name, framing{cn})
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
		cn.vectored = true
	}
	cn.raw = spliceSocket(c)
	return cn
}

func (c *conn) opErr(op string, err error) error { return c.ends.OpError(op, err) }

// CloseWrite shuts down the writing side: it sends an end frame, after
// which the peer reads io.EOF, and shuts down the underlying connection's
// writing side if it can (framed.Ends.CloseWrite).
func (c *conn) CloseWrite() error { return c.ends.CloseWrite() }

// Close closes the connection as a socket's close does: the end frame is
// still sent, in the background for up to framed.CloseLinger, unless a
// Write is in progress or failed, which cuts the stream short
// (framed.Ends.Close).
func (c *conn) Close() error { return c.ends.Close() }

// Abort closes the connection without its end frame and aborts the one
// below (netconn.Abort), so the peer sees a failure, never an end of
// stream: relays and multi-link layers call it when the other side of a
// stream failed.
func (c *conn) Abort() error { return c.ends.Abort() }

// framing is the layer's part of its ends: the end frame, the tail a
// deadline left, the read buffers.
type framing struct{ c *conn }

func (f framing) WriteEnd() (bool, error) {
	c := f.c
	fb := framePool.Get().(*[]byte)
	(*header)(*fb).set(frameEnd, 0, 0)
	sent, err := c.send(fb, headerSize)
	if sent {
		c.cnt.sent.Add(headerSize)
	}
	return sent, err
}

func (f framing) FlushTail() error { return f.c.flushTail() }
func (f framing) DropTail()        { f.c.dropTail() }
func (f framing) ReleaseRead()     { f.c.releaseRead() }

// NetConn returns the connection below, as tls.Conn.NetConn does, for
// what reads its state (the kernel's byte counts of the socket at the
// bottom, netconn.TCPBelow). Reading or writing it would corrupt the
// frames.
func (c *conn) NetConn() net.Conn { return c.c }

func (c *conn) LocalAddr() net.Addr  { return c.c.LocalAddr() }
func (c *conn) RemoteAddr() net.Addr { return c.c.RemoteAddr() }

// The read deadline goes through ends: once the peer's end marker is
// read, it no longer reaches below (framed.Ends.SetReadDeadline).
func (c *conn) SetDeadline(t time.Time) error      { return c.ends.SetDeadline(t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.ends.SetReadDeadline(t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.c.SetWriteDeadline(t) }

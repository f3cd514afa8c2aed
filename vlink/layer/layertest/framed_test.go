package layertest_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// framed is a filter as a third party might write one, to run the suite
// on: frames of at most 16 KiB behind a 4-byte length, and an empty
// frame that ends the stream. mutation breaks it on purpose, so the
// suite's own tests see it fail:
//
//   - "abort-as-close": Abort closes, end frame and all;
//   - "eof-at-cut": a stream that ends without its end frame, between
//     two frames, reads as io.EOF.
type framed struct{ mutation string }

func (f framed) Client(c net.Conn) (net.Conn, error) {
	return &frameConn{Conn: c, mutation: f.mutation}, nil
}
func (f framed) Server(c net.Conn) (net.Conn, error) {
	return &frameConn{Conn: c, mutation: f.mutation}, nil
}

const maxFrame = 16 << 10

type frameConn struct {
	net.Conn // below: deadlines and addresses go straight to it
	mutation string
	closed   atomic.Bool

	rmu  sync.Mutex
	hdr  [4]byte
	nhdr int   // bytes of hdr read so far: a deadline may fall mid-header
	left int   // payload bytes left in the current frame
	rend error // io.EOF after the end frame, or why the stream failed

	wmu     sync.Mutex
	pending []byte // the tail of a frame a deadline cut short, sent first
	wdone   bool   // the end frame is sent
}

var (
	_ net.Conn            = (*frameConn)(nil)
	_ netconn.Aborter     = (*frameConn)(nil)
	_ netconn.CloseWriter = (*frameConn)(nil)
)

func (c *frameConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "framed", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

func (c *frameConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opErr("read", net.ErrClosed)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for c.left == 0 {
		if c.rend != nil {
			return 0, c.rend
		}
		n, err := c.Conn.Read(c.hdr[c.nhdr:])
		if c.nhdr += n; c.nhdr == len(c.hdr) {
			c.nhdr = 0
			if c.left = int(binary.BigEndian.Uint32(c.hdr[:])); c.left == 0 {
				c.rend = io.EOF
			}
			continue
		}
		if err != nil {
			return 0, c.readErr(err, c.nhdr == 0)
		}
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= n
	if n == 0 && err != nil {
		return 0, c.readErr(err, false)
	}
	return n, nil
}

// readErr is what Read returns for an error from below: a stream that
// ends there without its end frame failed.
func (c *frameConn) readErr(err error, betweenFrames bool) error {
	if err != io.EOF {
		return err // a deadline, a reset, a close: the connection below says it
	}
	if betweenFrames && c.mutation == "eof-at-cut" {
		return io.EOF
	}
	c.rend = c.opErr("read", io.ErrUnexpectedEOF)
	return c.rend
}

func (c *frameConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opErr("write", net.ErrClosed)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wdone {
		return 0, c.opErr("write", errors.New("write after CloseWrite"))
	}
	if err := c.flush(); err != nil {
		return 0, err
	}
	var total int
	for len(p) > 0 {
		chunk := min(len(p), maxFrame)
		buf := make([]byte, 4+chunk)
		binary.BigEndian.PutUint32(buf, uint32(chunk))
		copy(buf[4:], p[:chunk])
		if n, err := c.Conn.Write(buf); err != nil {
			if n > 0 { // the frame is begun: its tail goes first next time
				c.pending = buf[n:]
				total += chunk
			}
			return total, err
		}
		total += chunk
		p = p[chunk:]
	}
	return total, nil
}

// flush sends what a deadline left of the last frame. wmu held.
func (c *frameConn) flush() error {
	for len(c.pending) > 0 {
		n, err := c.Conn.Write(c.pending)
		c.pending = c.pending[n:]
		if err != nil {
			return err
		}
	}
	return nil
}

// sendEnd sends the end frame once. wmu held.
func (c *frameConn) sendEnd() error {
	if c.wdone {
		return nil
	}
	if err := c.flush(); err != nil {
		return err
	}
	c.wdone = true
	_, err := c.Conn.Write(make([]byte, 4))
	return err
}

func (c *frameConn) CloseWrite() error {
	if c.closed.Load() {
		return c.opErr("close", net.ErrClosed)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.sendEnd(); err != nil {
		return err
	}
	return netconn.CloseWrite(c.Conn)
}

// Close sends the end frame unless a Write is in progress (then the
// stream is cut), bounded by a second if the peer does not read.
func (c *frameConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	if c.wmu.TryLock() {
		c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		c.sendEnd()
		c.wmu.Unlock()
	}
	return c.Conn.Close()
}

// Abort ends the stream without its end frame, and aborts the
// connection below.
func (c *frameConn) Abort() error {
	if c.mutation == "abort-as-close" {
		return c.Close()
	}
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	return netconn.Abort(c.Conn)
}

// NetConn returns the connection below, for what looks below (never to
// read or write it).
func (c *frameConn) NetConn() net.Conn { return c.Conn }

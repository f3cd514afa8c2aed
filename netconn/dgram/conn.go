package dgram

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// A Conn carries datagrams over a stream, one frame each: a Write sends
// one datagram, a Read returns one, cut to the buffer's size as a UDP
// socket's read cuts it. The far side's socket errors arrive as errors of
// Read (ECONNREFUSED for a port that answered with ICMP, ...), once each,
// and the Conn carries on, as a connected UDP socket does. The end of the
// stream is io.EOF; its failure is the stream's error.
//
// A Conn is safe for one reader and one writer at once. A deadline that
// expires in the middle of a frame leaves the frame whole for the next
// Read; a Write that fails with part of its frame sent leaves the stream
// out of step, so every later Write fails with the same error.
type Conn struct {
	stream        net.Conn
	local, remote net.Addr
	over          *over // the carrier beside the stream; nil for none

	rmu  sync.Mutex
	r    *bufio.Reader // made at the first Read: a frame fits whole
	rerr error         // a malformed frame: the stream is out of step

	wmu  sync.Mutex
	wbuf []byte
	werr error // a frame cut short
}

var (
	_ net.Conn       = (*Conn)(nil)
	_ net.PacketConn = (*Conn)(nil)
)

// NewConn returns a Conn carrying datagrams over stream. local and remote
// are what LocalAddr and RemoteAddr report (the UDP addresses the
// datagrams are for, rather than the stream's); nil reports the stream's.
func NewConn(stream net.Conn, local, remote net.Addr) *Conn {
	if local == nil {
		local = stream.LocalAddr()
	}
	if remote == nil {
		remote = stream.RemoteAddr()
	}
	return &Conn{stream: stream, local: local, remote: remote}
}

// Read reads one datagram into b, and discards what does not fit.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rerr != nil {
		return 0, c.rerr
	}
	if c.over != nil {
		return c.over.read(c, b)
	}
	body, errno, err := c.frame()
	switch {
	case errno != nil:
		return 0, errno
	case errors.Is(err, ErrMalformed):
		c.rerr = err
		return 0, err
	case err != nil:
		return 0, err
	}
	n := copy(b, body)
	c.r.Discard(HeaderSize + len(body))
	return n, nil
}

// frame reads the stream's next frame: a datagram's body, in the
// reader's buffer until the caller discards it and its header; or the
// errno an error frame carries, discarded; or the error that kept a
// frame from being read (a malformed one matches ErrMalformed). The
// caller holds rmu, or is the stream's only reader.
func (c *Conn) frame() (body []byte, errno, err error) {
	if c.r == nil {
		c.r = bufio.NewReaderSize(c.stream, HeaderSize+MaxDatagram)
	}
	p, err := c.r.Peek(HeaderSize)
	if err != nil {
		return nil, nil, c.readErr(p, err)
	}
	h := header(p)
	if err := checkHeader(h); err != nil {
		return nil, nil, c.opError("read", err)
	}
	if p, err = c.r.Peek(HeaderSize + h.Len()); err != nil {
		return nil, nil, c.readErr(p, err) // a timeout keeps the frame for the next Read
	}
	body = p[HeaderSize:]
	if h.Type() == frameError {
		code, ok := errorCode(body[0]).errno()
		c.r.Discard(len(p))
		if !ok {
			return nil, nil, c.opError("read", fmt.Errorf("%w: error code %d", ErrMalformed, body[0]))
		}
		return nil, c.opError("read", code), nil
	}
	return body, nil, nil
}

// readErr is the error of a Read whose frame, of which p came, could not
// be read whole.
func (c *Conn) readErr(p []byte, err error) error {
	if errors.Is(err, io.EOF) && len(p) > 0 {
		return c.opError("read", fmt.Errorf("the stream ended inside a datagram: %w", io.ErrUnexpectedEOF))
	}
	return err // io.EOF between datagrams; the stream's own error
}

// Write sends b as one datagram.
func (c *Conn) Write(b []byte) (int, error) {
	if len(b) > MaxDatagram {
		return 0, c.opError("write", syscall.EMSGSIZE)
	}
	if c.over != nil && c.over.send(b) {
		return len(b), nil
	}
	h := makeHeader(frameData, len(b))
	if err := c.write(h, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// writeBatch sends each of batch as one datagram, in one write to the
// stream: a burst costs the stream one call.
func (c *Conn) writeBatch(batch [][]byte) error {
	if c.over != nil {
		for _, d := range batch {
			if _, err := c.Write(d); err != nil {
				return err
			}
		}
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	c.wbuf = c.wbuf[:0]
	for _, d := range batch {
		if len(d) > MaxDatagram {
			return c.opError("write", syscall.EMSGSIZE)
		}
		h := makeHeader(frameData, len(d))
		c.wbuf = append(append(c.wbuf, h[:]...), d...)
	}
	n, err := c.stream.Write(c.wbuf)
	if err != nil && n > 0 {
		c.werr = c.opError("write", fmt.Errorf("datagrams were cut short, the stream is out of step: %w", err))
	}
	return err
}

// WriteError sends the far side err, when it is a socket error a
// datagram's sender would see (ECONNREFUSED, EHOSTUNREACH, ENETUNREACH,
// EMSGSIZE): the far side's Read returns it. It reports whether err is
// one that crosses; the error is the stream's.
func (c *Conn) WriteError(err error) (bool, error) {
	code, ok := codeOf(err)
	if !ok {
		return false, nil
	}
	return true, c.write(makeHeader(frameError, 1), []byte{byte(code)})
}

func (c *Conn) write(h header, body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	// One write per frame: the layers below see one datagram at a time.
	c.wbuf = append(append(c.wbuf[:0], h[:]...), body...)
	n, err := c.stream.Write(c.wbuf)
	if err != nil && n > 0 {
		c.werr = c.opError("write", fmt.Errorf("a datagram was cut short, the stream is out of step: %w", err))
	}
	return err
}

// ReadFrom reads one datagram, from the address the Conn is connected to.
func (c *Conn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, err := c.Read(b)
	return n, c.remote, err
}

// WriteTo sends b to addr, which must be nil or the address the Conn is
// connected to, as a connected UDP socket requires.
func (c *Conn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if addr != nil && addr.String() != c.remote.String() {
		return 0, c.opError("write", net.ErrWriteToConnected)
	}
	return c.Write(b)
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "udp", Source: c.local, Addr: c.remote, Err: err}
}

// Close closes the stream: the far side's Read returns io.EOF.
func (c *Conn) Close() error {
	if c.over != nil {
		c.over.close()
	}
	return c.stream.Close()
}

// Abort resets the stream (netconn.Abort): the far side's Read fails.
func (c *Conn) Abort() error {
	if c.over != nil {
		c.over.close()
	}
	return netconn.Abort(c.stream)
}

// UnwrapConn returns the stream.
func (c *Conn) UnwrapConn() net.Conn { return c.stream }

func (c *Conn) LocalAddr() net.Addr                { return c.local }
func (c *Conn) RemoteAddr() net.Addr               { return c.remote }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.stream.SetWriteDeadline(t) }

func (c *Conn) SetDeadline(t time.Time) error {
	if c.over != nil {
		if err := c.over.setReadDeadline(t); err != nil {
			return c.opError("set deadline", err)
		}
		return c.stream.SetWriteDeadline(t)
	}
	return c.stream.SetDeadline(t)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.over != nil {
		if err := c.over.setReadDeadline(t); err != nil {
			return c.opError("set deadline", err)
		}
		return nil
	}
	return c.stream.SetReadDeadline(t)
}

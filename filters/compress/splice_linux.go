package compress

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/vlink-dev/vlink/netconn"
)

// A raw frame's payload is the application's bytes as they are: between
// two kernel sockets it need not enter the process. ReadFrom writes a
// raw frame's header and splices its payload from the source socket;
// WriteTo reads a raw frame's header and splices its payload to the
// destination socket (netconn.Pipe). Compressed frames, and the blocks
// the writer tries to compress, go through the process as before.

// spliceSocket returns c's socket if payloads may be spliced to or from
// it: a *net.TCPConn or stream *net.UnixConn, whose bytes are all the
// kernel's.
func spliceSocket(c net.Conn) syscall.RawConn { return netconn.RawSocket(c) }

func spliceReadable(c net.Conn, rc syscall.RawConn) (int64, error) { return netconn.Readable(c, rc) }

// spliceBlock sends at most max bytes of src as a raw frame, the payload
// spliced from src's socket to the one below. It returns the payload's
// size, and the frame's size on the wire once the frame counts as sent:
// as in send, a frame a deadline cuts counts as sent, its rest kept in
// c.tail. The write lock is held.
func (c *conn) spliceBlock(src net.Conn, rc syscall.RawConn, max int, more bool) (n, wire int, err error) {
	p, err := netconn.GetPipe()
	if err != nil {
		return 0, 0, err
	}
	defer p.Put()
	n, err = p.Fill(src, rc, max, false)
	if n == 0 {
		return 0, 0, err // none now (nil), the end (io.EOF), or src's error
	}
	h := &c.shdr
	h.set(frameRaw, n, n)
	k, err := p.Send(c.c, c.raw, h[:])
	if err == nil {
		_, err = p.Drain(c.c, c.raw, more)
	}
	if err == nil {
		return n, headerSize + n, nil
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) || c.ends.Closed() {
		return n, 0, c.ends.WriteErr(err)
	}
	// The bytes are out of src: what the deadline left of the frame is
	// sent before anything else, as send keeps its tail.
	fb := framePool.Get().(*[]byte)
	m := copy(*fb, h[k:])
	out, rerr := p.ReadOut((*fb)[m : m+p.Len()])
	if rerr != nil {
		framePool.Put(fb)
		return n, 0, c.ends.FailWrite(rerr)
	}
	c.tail, c.tailData = fb, (*fb)[:m+out]
	return n, headerSize + n, err
}

// spliceRaw moves what has come of the current raw frame's payload from
// the socket below to w's socket, rc, and, while whole raw frames follow
// at once, their payloads too, in one splice to w: a frame costs a read
// of its header and a splice into the pipe. If w fails, the bytes it did
// not take are kept for a later Read, as WriteTo keeps decoded bytes.
// The read lock is held.
func (c *conn) spliceRaw(w net.Conn, rc syscall.RawConn) (int, error) {
	p, err := netconn.GetPipe()
	if err != nil {
		return 0, err
	}
	defer p.Put()
	for wait := true; ; wait = false {
		n, err := p.Fill(c.c, c.raw, c.rawLeft, wait)
		if n == 0 {
			if p.Len() == 0 {
				return 0, c.readErr(err)
			}
			break // an error comes again with the next read
		}
		c.rawLeft -= n
		if c.rawLeft > 0 || p.Len() >= maxSpliceBatch || !c.nextRawFrame() {
			break
		}
	}
	k, err := p.Drain(w, rc, false)
	if err != nil && p.Len() > 0 {
		if p.Len() <= MaxBlock {
			c.outBuf = blockPool.Get().(*[]byte)
		} else {
			b := make([]byte, p.Len()) // a batch: rare, and drain pools it
			c.outBuf = &b
		}
		m, _ := p.ReadOut((*c.outBuf)[:p.Len()])
		c.out = (*c.outBuf)[:m]
	}
	return k, err
}

// maxSpliceBatch bounds what spliceRaw gathers in its pipe before it
// passes it on, well under the pipe's size.
const maxSpliceBatch = 512 << 10

// nextRawFrame reads the next frame's header if it has come, without
// waiting, and reports whether it is a raw frame's, now current. Any
// other frame is left to WriteTo, its header read or partly read.
func (c *conn) nextRawFrame() bool {
	if c.peekHdr == nil {
		c.peekHdr = c.peekHdrFD // made once: a closure per call is an allocation per frame
	}
	c.peekN, c.peekErr = 0, nil
	c.raw.Read(c.peekHdr)
	if c.peekErr != nil || c.peekN <= 0 {
		return false // nothing yet, or an end or error the next read meets again
	}
	c.hdrN += c.peekN
	if c.hdrN < headerSize {
		return false
	}
	ready, err := c.nextFrame(false)
	return err == nil && ready && c.rawLeft > 0
}

func (c *conn) peekHdrFD(fd uintptr) bool {
	for {
		c.peekN, c.peekErr = syscall.Read(int(fd), c.hdr[c.hdrN:])
		if c.peekErr != syscall.EINTR {
			return true // never park: a header not yet here ends the batch
		}
	}
}

// readNow reads what src's socket, rc, has queued into b, at most len(b)
// bytes, without waiting: 0 and a nil error when it has none, io.EOF at
// its end. The write lock is held.
func (c *conn) readNow(src net.Conn, rc syscall.RawConn, b []byte) (int, error) {
	if c.readFn == nil {
		c.readFn = c.readFD // made once: a closure per call is an allocation per block
	}
	c.readBuf, c.readN, c.readErrno = b, 0, nil
	err := rc.Read(c.readFn)
	c.readBuf = nil
	switch {
	case err != nil:
		return 0, err
	case c.readErrno == syscall.EAGAIN:
		return 0, nil
	case c.readErrno != nil:
		return 0, &net.OpError{Op: "read", Net: src.LocalAddr().Network(), Source: src.LocalAddr(),
			Addr: src.RemoteAddr(), Err: os.NewSyscallError("read", c.readErrno)}
	case c.readN == 0:
		return 0, io.EOF
	}
	return c.readN, nil
}

func (c *conn) readFD(fd uintptr) bool {
	for {
		c.readN, c.readErrno = syscall.Read(int(fd), c.readBuf)
		if c.readErrno != syscall.EINTR {
			return true // never park: the caller waits without the lock
		}
	}
}

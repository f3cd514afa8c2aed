package compress

import (
	"io"
	"net"
	"syscall"

	"github.com/vlink-dev/vlink/netconn/framed"
)

// The read side takes bytes off the underlying connection in three ways:
//
//   - a frame header, when nothing is buffered, into c.hdr: waiting for
//     the next frame holds no buffer;
//   - a raw payload straight into the caller's buffer, asking in the same
//     read for up to readAhead bytes that follow: raw frames among them
//     are moved into place behind it, the rest is kept in c.rbuf;
//   - a compressed payload, with whatever follows it, into c.rbuf.
//
// c.rbuf is a pooled buffer held only while it has bytes not yet parsed.
// All of this state survives an interrupted read, so a deadline may fire
// anywhere in a frame without losing a byte.

// readAhead is what a read asks for past the frame it needs: reading up
// to 256 KiB at a time rather than frame by frame lets a reader of small
// raw frames nearly keep up with plain TCP (BENCHMARKS.txt). Whatever of
// it has to be kept fits in c.rbuf, which also holds any compressed
// payload (shorter than MaxBlock).
const readAhead = 2 * MaxBlock

// Read reads decoded bytes. Raw frames are read straight into p, and a
// compressed frame is decoded straight into p when it fits. Read returns
// what it has rather than wait for more.
func (c *conn) Read(p []byte) (int, error) {
	c.ends.LockRead()
	defer c.ends.UnlockRead()
	if err := c.ends.ReadClosed(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		if len(c.out) > 0 {
			n += c.drain(p[n:])
			continue
		}
		if c.rerr != nil {
			break
		}
		if c.rawLeft > 0 {
			if b := c.buffered(); len(b) > 0 {
				k := copy(p[n:], b[:min(len(b), c.rawLeft)])
				c.rawLeft -= k
				c.consume(k)
				n += k
				continue
			}
			if n > 0 {
				break
			}
			k, err := c.readRaw(p)
			if err != nil {
				return k, c.readErr(err)
			}
			n = k
			continue
		}
		ready, err := c.nextFrame(n == 0)
		if err != nil {
			if n > 0 {
				break // err is sticky: the next Read returns it
			}
			return 0, err
		}
		if !ready {
			break
		}
		if !c.inComp {
			continue
		}
		raw := c.hdr.RawLen()
		if len(p)-n >= raw {
			if err := c.decodeFrame(p[n : n+raw]); err != nil {
				if n > 0 {
					break
				}
				return 0, err
			}
			n += raw
			continue
		}
		c.outBuf = blockPool.Get().(*[]byte)
		c.out = (*c.outBuf)[:raw]
		if err := c.decodeFrame(c.out); err != nil {
			if n > 0 {
				break
			}
			return 0, err
		}
	}
	if n == 0 && c.rerr != nil && len(p) > 0 {
		return 0, c.rerr
	}
	return n, nil
}

// WriteTo writes the decoded stream to w until EOF or an error. Waiting
// for a frame header it holds no buffer, so relaying an idle connection
// pins no memory.
func (c *conn) WriteTo(w io.Writer) (int64, error) {
	c.ends.LockRead()
	defer c.ends.UnlockRead()
	// Raw payloads go from socket to socket where both ends are kernel
	// sockets (splice_linux.go).
	var wc net.Conn
	var wrc syscall.RawConn
	if c.raw != nil {
		if wc, _ = w.(net.Conn); wc != nil {
			wrc = spliceSocket(wc)
		}
	}
	var total int64
	for {
		if err := c.ends.ReadClosed(); err != nil {
			return total, err
		}
		if len(c.out) > 0 {
			k, err := w.Write(c.out)
			total += int64(k)
			c.out = c.out[k:]
			if err != nil {
				return total, err // the rest stays for a later Read
			}
			c.drain(nil)
		}
		if c.rerr != nil {
			if c.rerr == io.EOF {
				return total, nil
			}
			return total, c.rerr
		}
		if c.rawLeft > 0 {
			if b := c.buffered(); len(b) > 0 {
				k, err := w.Write(b[:min(len(b), c.rawLeft)])
				total += int64(k)
				c.rawLeft -= k
				c.consume(k)
				if err != nil {
					return total, err
				}
				continue
			}
			if wrc != nil {
				k, err := c.spliceRaw(wc, wrc)
				total += int64(k)
				if err != nil {
					return total, err
				}
				continue
			}
			buf := readPool.Get().(*[]byte)
			k, err := c.readRaw(*buf)
			if k > 0 {
				m, werr := w.Write((*buf)[:k])
				total += int64(m)
				if werr != nil {
					readPool.Put(buf)
					return total, werr
				}
			}
			readPool.Put(buf)
			if err != nil {
				return total, c.readErr(err)
			}
			continue
		}
		if _, err := c.nextFrame(true); err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
		if !c.inComp {
			continue
		}
		c.outBuf = blockPool.Get().(*[]byte)
		c.out = (*c.outBuf)[:c.hdr.RawLen()]
		if err := c.decodeFrame(c.out); err != nil {
			return total, err
		}
	}
}

// readRaw reads the current raw frame's payload straight into p. It asks
// in the same read for up to readAhead bytes that follow, using p past
// the payload as scratch space: raw frames among them are moved into
// place behind the payload, and from the first that cannot be (a
// compressed frame, a partial header) on, the bytes are kept in c.rbuf.
// Nothing may be buffered when it is called.
func (c *conn) readRaw(p []byte) (int, error) {
	n, err := c.c.Read(p[:min(len(p), c.rawLeft+readAhead)])
	if n > 0 && err == io.EOF {
		err = nil // the next read sees EOF again, after what came with it is parsed
	}
	if n <= c.rawLeft {
		c.rawLeft -= n
		return n, err
	}
	got, rest := c.rawLeft, p[c.rawLeft:n]
	c.rawLeft = 0
	for len(rest) > 0 {
		if c.rawLeft > 0 {
			k := copy(p[got:], rest[:min(len(rest), c.rawLeft)])
			got += k
			c.rawLeft -= k
			rest = rest[k:]
			continue
		}
		if len(rest) >= headerSize {
			if h := (*header)(rest); h.Type() == frameRaw && h.check(c.dec) == nil {
				c.rawLeft = h.RawLen()
				c.countFrame(h)
				rest = rest[headerSize:]
				continue
			}
		}
		c.rbuf = readPool.Get().(*[]byte)
		c.r, c.w = 0, copy(*c.rbuf, rest)
		break
	}
	return got, err
}

// nextFrame reads the next frame header and, for a compressed frame, its
// whole payload into c.rbuf, setting c.rawLeft or c.inComp. With wait
// false it reads only what is buffered, and reports false where it would
// have to read from the connection.
func (c *conn) nextFrame(wait bool) (ready bool, err error) {
	if !c.inComp {
		if b := c.buffered(); len(b) > 0 {
			k := copy(c.hdr[c.hdrN:], b)
			c.hdrN += k
			c.consume(k)
		}
		for c.hdrN < headerSize {
			if !wait {
				return false, nil
			}
			k, err := c.c.Read(c.hdr[c.hdrN:])
			c.hdrN += k
			if err != nil && (c.hdrN < headerSize || err != io.EOF) {
				return false, c.readErr(err)
			}
		}
		if err := c.hdr.check(c.dec); err != nil {
			return false, c.fail(err)
		}
		c.hdrN = 0
		c.countFrame(&c.hdr)
		switch c.hdr.Type() {
		case frameEnd:
			c.rerr = io.EOF // anything after it is ignored
			c.ends.PeerEnded()
			c.releaseRead()
			return true, nil
		case frameRaw:
			c.rawLeft = c.hdr.RawLen()
			return true, nil
		}
		c.inComp = true
	}
	plen := c.hdr.PayloadLen()
	for c.w-c.r < plen {
		if !wait {
			return false, nil
		}
		if c.rbuf == nil {
			c.rbuf = readPool.Get().(*[]byte)
		}
		buf := *c.rbuf
		if len(buf)-c.r < plen { // make room for the whole payload
			c.w = copy(buf, buf[c.r:c.w])
			c.r = 0
		}
		k, err := c.c.Read(buf[c.w:])
		c.w += k
		if err != nil && (c.w-c.r < plen || err != io.EOF) {
			c.consume(0)
			return false, c.readErr(err)
		}
	}
	return true, nil
}

// countFrame counts a frame read, for Stats.
func (c *conn) countFrame(h *header) {
	c.cnt.received.Add(uint64(headerSize + h.PayloadLen()))
	c.cnt.decoded.Add(uint64(h.RawLen()))
}

// decodeFrame decodes the buffered payload of the current compressed
// frame into dst, which has its raw length, and consumes it.
func (c *conn) decodeFrame(dst []byte) error {
	plen := c.hdr.PayloadLen()
	err := c.dec[c.hdr.Codec()].decompress(dst, (*c.rbuf)[c.r:c.r+plen])
	c.inComp = false
	c.consume(plen)
	if err != nil {
		return c.fail(err)
	}
	return nil
}

// buffered returns the bytes in c.rbuf not yet parsed.
func (c *conn) buffered() []byte {
	if c.rbuf == nil {
		return nil
	}
	return (*c.rbuf)[c.r:c.w]
}

// consume marks k buffered bytes parsed, and frees c.rbuf once empty.
func (c *conn) consume(k int) {
	c.r += k
	if c.rbuf != nil && c.r == c.w {
		readPool.Put(c.rbuf)
		c.rbuf, c.r, c.w = nil, 0, 0
	}
}

// drain copies decoded bytes to p and frees their buffer once empty.
func (c *conn) drain(p []byte) int {
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 {
		blockPool.Put(c.outBuf)
		c.outBuf, c.out = nil, nil
	}
	return n
}

// readErr sorts an error of the underlying Read. Deadlines and transport
// errors are returned unchanged and leave the frame state as it is; the
// end of the connection is always a failure (a clean end is the end
// frame, which nextFrame handles).
func (c *conn) readErr(err error) error {
	if err := c.ends.ReadClosed(); err != nil {
		return err
	}
	if err != io.EOF {
		c.ends.ReadErr(err)
		return err
	}
	if c.hdrN > 0 || c.inComp || c.rawLeft > 0 {
		return c.fail(io.ErrUnexpectedEOF)
	}
	// The connection ended before the end frame: the peer was killed, or a
	// hop cut the stream short. Only the end frame is a clean end.
	return c.fail(framed.ErrNoEnd)
}

// fail ends the read side for good.
func (c *conn) fail(err error) error {
	c.ends.ReadFailed()
	c.rerr = c.opErr("read", err)
	c.releaseRead()
	return c.rerr
}

func (c *conn) releaseRead() {
	if c.rbuf != nil {
		readPool.Put(c.rbuf)
		c.rbuf, c.r, c.w = nil, 0, 0
	}
	if c.outBuf != nil {
		blockPool.Put(c.outBuf)
		c.outBuf, c.out = nil, nil
	}
}

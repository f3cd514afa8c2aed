package noise

import (
	"fmt"
	"io"

	"github.com/vlink-dev/vlink/netconn/framed"
)

// The read side takes a record's header into c.hdr and its body into
// c.rbuf, a pooled buffer that also keeps whatever followed it in the
// same read and is held only while it has bytes not yet returned. All of
// this state survives an interrupted read, so a deadline may fire
// anywhere in a record without losing a byte. A record's body is opened
// straight into the caller's buffer when it fits, else in place.

// Read reads opened bytes. It returns what one record gave rather than
// wait for more.
func (c *conn) Read(p []byte) (int, error) {
	if err := c.ready(); err != nil {
		return 0, err
	}
	c.ends.LockRead()
	defer c.ends.UnlockRead()
	if err := c.ends.ReadClosed(); err != nil {
		return 0, err
	}
	for {
		if len(c.plain) > 0 {
			n := copy(p, c.plain)
			c.plain = c.plain[n:]
			if len(c.plain) == 0 {
				c.consume(0)
			}
			return n, nil
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		if err := c.readRecord(); err != nil {
			return 0, err
		}
		n, err := c.openRecord(p)
		if err != nil || n > 0 {
			return n, err
		}
	}
}

// readRecord makes the next record's header c.hdr and its body
// (*c.rbuf)[c.r:c.r+c.hdr.Len()]. Waiting for a header it holds no
// buffer, so an idle connection pins no memory.
func (c *conn) readRecord() error {
	if !c.inRec {
		if b := c.buffered(); len(b) > 0 {
			k := copy(c.hdr[c.hdrN:], b)
			c.hdrN += k
			c.consume(k)
		}
		for c.hdrN < headerSize {
			k, err := c.c.Read(c.hdr[c.hdrN:])
			c.hdrN += k
			if err != nil && (c.hdrN < headerSize || err != io.EOF) {
				return c.readErr(err)
			}
		}
		if err := c.hdr.check(); err != nil {
			return c.fail(err)
		}
		c.hdrN = 0
		c.inRec = true
	}
	n := c.hdr.Len()
	for c.w-c.r < n {
		if c.rbuf == nil {
			c.rbuf = readPool.Get().(*[]byte)
		}
		buf := *c.rbuf
		if len(buf)-c.r < n { // make room for the whole body
			c.w = copy(buf, buf[c.r:c.w])
			c.r = 0
		}
		k, err := c.c.Read(buf[c.w:])
		c.w += k
		if err != nil && (c.w-c.r < n || err != io.EOF) {
			c.consume(0)
			return c.readErr(err)
		}
	}
	return nil
}

// openRecord opens the record readRecord made ready, into p if its
// plaintext fits, else in place into c.plain, and returns the bytes put
// in p.
func (c *conn) openRecord(p []byte) (int, error) {
	n := c.hdr.Len()
	body := (*c.rbuf)[c.r : c.r+n]
	direct := len(p) >= n-tagSize
	dst := body[:0]
	if direct {
		dst = p[:0]
	}
	out, err := c.recv.open(dst, c.hdr[:], body)
	c.inRec = false
	c.r += n
	if err != nil {
		return 0, c.fail(fmt.Errorf("%w: record %d does not authenticate: it was changed, replayed, reordered or dropped on the way", ErrAuth, c.recv.n))
	}
	if c.hdr.Type() == recEnd {
		c.rerr = io.EOF // anything after it is ignored
		c.ends.PeerEnded()
		c.releaseRead()
		return 0, nil
	}
	if direct {
		c.consume(0)
		return len(out), nil
	}
	c.plain = out
	return 0, nil
}

// buffered returns the bytes in c.rbuf not yet parsed.
func (c *conn) buffered() []byte {
	if c.rbuf == nil {
		return nil
	}
	return (*c.rbuf)[c.r:c.w]
}

// consume marks k buffered bytes parsed, and frees c.rbuf once it holds
// nothing more.
func (c *conn) consume(k int) {
	c.r += k
	if c.rbuf != nil && c.r == c.w && len(c.plain) == 0 {
		readPool.Put(c.rbuf)
		c.rbuf, c.r, c.w = nil, 0, 0
	}
}

// readErr sorts an error of the underlying Read. Deadlines and transport
// errors are returned unchanged and leave the record state as it is; the
// end of the connection is always a failure (a clean end is the end
// record).
func (c *conn) readErr(err error) error {
	if err := c.ends.ReadClosed(); err != nil {
		return err
	}
	if err != io.EOF {
		c.ends.ReadErr(err)
		return err
	}
	// The connection ended before the end record: the peer was killed, or
	// someone cut the stream short.
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
	c.plain = nil
	if c.rbuf != nil {
		readPool.Put(c.rbuf)
		c.rbuf, c.r, c.w = nil, 0, 0
	}
}

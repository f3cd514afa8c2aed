package noise

import (
	"errors"
	"os"
)

// Write seals p into records of at most MaxPlain bytes and sends them,
// up to writeBatch records per write to the connection below, before it
// returns.
func (c *conn) Write(p []byte) (int, error) {
	if e := c.early; e != nil && e.state.Load() != earlyDone {
		if e.hold(p) {
			return len(p), nil
		}
		if err := c.Handshake(); err != nil {
			return 0, err
		}
	}
	c.ends.LockWrite()
	defer c.ends.UnlockWrite()
	if err := c.ends.Writable(); err != nil {
		return 0, err
	}
	if err := c.flushTail(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		fb := writePool.Get().(*[]byte)
		buf := (*fb)[:0]
		start, first := n, c.send.n
		for k := 0; k < writeBatch && n < len(p); k++ {
			chunk := p[n:min(len(p), n+MaxPlain)]
			var err error
			if buf, err = c.seal(buf, recData, chunk); err != nil {
				writePool.Put(fb)
				return start, c.ends.FailWrite(c.opErr("write", err))
			}
			n += len(chunk)
		}
		sent, err := c.sendBuf(fb, buf)
		if err != nil {
			if !sent {
				// Nothing went out: the records are dropped and their
				// nonces used again, as if never sealed.
				c.send.n = first
				return start, err
			}
			return n, err
		}
	}
	return n, nil
}

// seal appends a record of type t carrying p to buf.
func (c *conn) seal(buf []byte, t recordType, p []byte) ([]byte, error) {
	off := len(buf)
	buf = append(buf, 0, 0, 0)
	h := (*header)(buf[off:])
	h.set(t, len(p)+tagSize)
	return c.send.seal(buf, h[:], p)
}

// sendBuf writes the records in buf, which fb holds, and frees fb. If a
// deadline cuts them, the peer has part of them: the rest is kept in
// c.tail, to be sent before anything else, and they count as sent, as
// they would with a buffered writer. If nothing went out, they count as
// not sent.
func (c *conn) sendBuf(fb *[]byte, buf []byte) (sent bool, err error) {
	k, err := c.c.Write(buf)
	if err == nil {
		writePool.Put(fb)
		return true, nil
	}
	if k == 0 && errors.Is(err, os.ErrDeadlineExceeded) && !c.ends.Closed() {
		writePool.Put(fb)
		return false, err
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) || c.ends.Closed() {
		writePool.Put(fb)
		return false, c.ends.WriteErr(err)
	}
	*fb = buf // keep the records, which may have grown past the pooled slice
	c.tail, c.tailData = fb, buf[k:]
	return true, err
}

// flushTail sends what a deadline left of the last records.
func (c *conn) flushTail() error {
	if c.tail == nil {
		return nil
	}
	k, err := c.c.Write(c.tailData)
	c.tailData = c.tailData[k:]
	if err != nil {
		return c.ends.WriteErr(err)
	}
	c.dropTail()
	return nil
}

func (c *conn) dropTail() {
	if c.tail != nil {
		*c.tail = (*c.tail)[:0]
		writePool.Put(c.tail)
		c.tail, c.tailData = nil, nil
	}
}

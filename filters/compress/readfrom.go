package compress

import (
	"io"
	"net"
	"syscall"
)

// ReadFrom writes what it reads from r, up to r's end, as Write would,
// and returns how many bytes it read. Relays call it: netconn.Relay hands
// it an *io.LimitedReader of the bytes a socket has queued.
//
// Where r is a kernel stream socket (or a LimitedReader of one) and the
// connection below is one too (Linux), a block the layer sends raw never
// enters the process: its header is written, then its payload spliced
// from socket to socket (splice_linux.go). On incompressible data that is
// every block but the few the layer tries to compress (the backoff, the
// auto layer's probes), so the layer costs about what identity costs.
// Otherwise it copies through a buffer, as io.Copy does.
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	lr, limited := r.(*io.LimitedReader)
	src := r
	if limited {
		src = lr.R
	}
	sc, _ := src.(net.Conn)
	rc := c.sourceSocket(sc)
	if rc == nil {
		return io.Copy(writerOnly{c}, r)
	}
	var total int64
	for {
		avail := int64(0)
		if limited {
			avail = lr.N
		} else {
			// Wait for bytes without the write lock, which Close must
			// find free to send the end frame.
			q, err := spliceReadable(sc, rc)
			if err != nil {
				return total, err
			}
			avail = q
		}
		if avail <= 0 {
			return total, nil
		}
		for avail > 0 {
			n, err := c.readBlock(sc, rc, int(min(avail, MaxBlock)), avail > MaxBlock)
			total += int64(n)
			avail -= int64(n)
			if limited {
				lr.N -= int64(n)
			}
			if err == io.EOF {
				return total, nil
			}
			if err != nil {
				return total, err
			}
			if n == 0 {
				// Nothing queued after all (a LimitedReader of the
				// caller's, not a relay's): wait without the lock.
				q, err := spliceReadable(sc, rc)
				if err != nil || q == 0 {
					return total, err
				}
			}
		}
	}
}

// writerOnly hides the conn's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// sourceSocket returns src's socket if ReadFrom may splice from it, and
// remembers it: a relay calls ReadFrom with the same source each time
// its socket is readable.
func (c *conn) sourceSocket(src net.Conn) syscall.RawConn {
	if src == nil || c.raw == nil {
		return nil
	}
	c.ends.LockWrite()
	defer c.ends.UnlockWrite()
	if src != c.rfSrc {
		c.rfSrc, c.rfRaw = src, spliceSocket(src)
	}
	return c.rfRaw
}

// readBlock sends the next block of src, at most max bytes, as one frame:
// spliced if the layer sends it raw unread, or read and sent as Write
// sends a block. With more, the caller has more bytes of src to send at
// once. It returns the bytes taken from src: 0 and no error when src had
// none, since it does not wait for src while it holds the write lock.
func (c *conn) readBlock(src net.Conn, rc syscall.RawConn, max int, more bool) (int, error) {
	c.ends.LockWrite()
	defer c.ends.UnlockWrite()
	ct, mark, err := c.startWrite()
	if err != nil {
		return 0, err
	}
	j, probe, try := c.plan(ct, mark, max)
	if !try {
		n, wire, err := c.spliceBlock(src, rc, max, more)
		if wire > 0 {
			c.account(ct, mark, j, n, wire, probe)
		}
		return n, err
	}
	fb := framePool.Get().(*[]byte)
	n, rerr := c.readNow(src, rc, (*fb)[headerSize:headerSize+max])
	if n == 0 {
		framePool.Put(fb)
		return 0, rerr
	}
	blk := (*fb)[headerSize : headerSize+n]
	cfb, size := c.attempt(ct, mark, j, probe, blk)
	if size == 0 {
		putFrame(cfb)
		(*header)(*fb).set(frameRaw, n, n)
		cfb, size = fb, headerSize+n
	} else {
		framePool.Put(fb)
	}
	sent, err := c.send(cfb, size)
	if sent {
		c.account(ct, mark, j, n, size, probe)
	}
	if err != nil {
		return n, err
	}
	return n, rerr
}

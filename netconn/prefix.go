package netconn

import (
	"io"
	"net"
)

// CloseWriter is implemented by connections that can shut down their
// writing side alone (TCP's half-close).
type CloseWriter interface {
	CloseWrite() error
}

// CloseWrite half-closes c if it can, and closes it otherwise: the peer
// sees the end of the stream either way.
func CloseWrite(c net.Conn) error {
	if cw, ok := c.(CloseWriter); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// An Unwrapper is a connection that passes bytes through unchanged to the
// one it wraps (it only adds methods), so Relay may copy from and to that
// one directly and reach its fast paths. A connection that transforms or
// buffers bytes (TLS, compression) must not implement it.
type Unwrapper interface {
	UnwrapConn() net.Conn
}

// Prefixed returns c with prefix put back in front of what it reads: the
// bytes a listener read to recognise the protocol. With an empty prefix it
// returns c itself, so a plain TCP connection stays a *net.TCPConn.
func Prefixed(c net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		return c
	}
	return &prefixConn{Conn: c, prefix: append([]byte(nil), prefix...)}
}

// prefixConn serves its prefix first, then the connection. Reads and
// WriteTo are not safe for concurrent use with each other, as for any
// net.Conn reader.
type prefixConn struct {
	net.Conn
	prefix []byte
}

var (
	_ net.Conn      = (*prefixConn)(nil)
	_ io.WriterTo   = (*prefixConn)(nil)
	_ io.ReaderFrom = (*prefixConn)(nil)
	_ CloseWriter   = (*prefixConn)(nil)
)

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// WriteTo drains the prefix, then hands the rest to io.Copy, so a relay
// between two TCP connections still reaches the kernel's zero-copy path
// (splice(2)).
func (c *prefixConn) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if len(c.prefix) > 0 {
		n, err := w.Write(c.prefix)
		total += int64(n)
		c.prefix = c.prefix[n:]
		if err != nil {
			return total, err
		}
	}
	n, err := io.Copy(w, c.Conn)
	return total + n, err
}

func (c *prefixConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

func (c *prefixConn) CloseWrite() error { return CloseWrite(c.Conn) }

// NetConn returns the connection below.
func (c *prefixConn) NetConn() net.Conn { return c.Conn }

// An Aborter is a connection with its own way of ending as a failure: a
// framed layer, whose Close sends its end marker, implements Abort to
// close without it (and to abort the connection below), so the peer sees
// an error rather than a clean end.
type Aborter interface {
	Abort() error
}

// Abort closes c so that its peer sees a failure, not an end of stream:
// the first Aborter among c and its wrappers aborts (which reaches the
// bottom), or else where the connection at the bottom of c's wrappers is
// TCP, it is reset (SO_LINGER 0) rather than closed with a FIN. A relay or
// a multi-link layer that fails in the middle of a stream aborts, so
// nothing downstream mistakes a truncated stream for a complete one.
func Abort(c net.Conn) error {
	for inner := c; inner != nil; {
		if a, ok := inner.(Aborter); ok {
			err := a.Abort()
			if inner != c {
				c.Close() // the wrappers above: their Close closes what is closed
			}
			return err
		}
		if tc, ok := inner.(*net.TCPConn); ok {
			tc.SetLinger(0)
			break
		}
		switch w := inner.(type) {
		case Unwrapper:
			inner = w.UnwrapConn()
		case interface{ NetConn() net.Conn }:
			inner = w.NetConn()
		default:
			inner = nil
		}
	}
	return c.Close()
}

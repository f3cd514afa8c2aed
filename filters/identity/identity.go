// Package identity provides the "identity" filter, which passes bytes
// through unchanged. It exercises what every filter goes through (the
// hello that mirrors it, the wrapping of connections) at no cost, and is
// the baseline the compression filters are measured against.
package identity

import (
	"errors"
	"io"
	"net"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name:    "identity",
		Kind:    layer.KindFilter,
		Summary: "pass bytes through unchanged (for testing stacks)",
		New:     func(layer.Args) (any, error) { return Filter{}, nil },
	})
}

// Filter is the identity filter. It implements layer.Filter.
type Filter struct{}

var _ layer.Filter = Filter{}

// Client wraps c; the returned connection owns it.
func (Filter) Client(c net.Conn) (net.Conn, error) { return &conn{c}, nil }

// Server wraps c; the returned connection owns it.
func (Filter) Server(c net.Conn) (net.Conn, error) { return &conn{c}, nil }

// conn is a thin wrapper: every method goes straight to the underlying
// connection, including ReadFrom and WriteTo, so that a relay of plain
// TCP connections through it still takes the kernel's zero-copy path
// (splice(2)).
type conn struct{ net.Conn }

var (
	_ net.Conn      = (*conn)(nil)
	_ io.ReaderFrom = (*conn)(nil)
	_ io.WriterTo   = (*conn)(nil)

	_ netconn.Unwrapper = (*conn)(nil)
)

// UnwrapConn returns the underlying connection, so that an abort
// (netconn.Abort) resets it rather than closing it cleanly.
func (c *conn) UnwrapConn() net.Conn { return c.Conn }

// CloseWrite shuts down the writing side of the underlying connection.
// It fails with an error matching errors.ErrUnsupported if that
// connection cannot half-close.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return &net.OpError{Op: "close", Net: "identity", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errors.ErrUnsupported}
}

// ReadFrom copies r to the underlying connection with its own ReadFrom
// when it has one (splice(2), sendfile(2)).
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(c.Conn, r)
}

// WriteTo copies the underlying connection to w with its own WriteTo when
// it has one.
func (c *conn) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := c.Conn.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, c.Conn)
}

package layer

import (
	"net"

	"github.com/vlink-dev/vlink/netconn"
)

// The optional methods of a layer's connections, found by type
// assertion. They are defined in package netconn, whose relay and abort
// use them on any connection; the names here are the same types.
type (
	// A CloseWriter shuts down its writing direction alone: the peer
	// reads the bytes written, then io.EOF, and can still write back.
	// Every layer's connection implements it, and passes the half-close
	// on to the connection below after its end marker, if it has one.
	CloseWriter = netconn.CloseWriter
	// An Aborter ends its stream as a failure: the peer reads an error,
	// never io.EOF. A layer with an end marker implements it to close
	// without sending the marker, and aborts the connection below
	// (netconn.Abort). A layer without one need not: netconn.Abort finds
	// the TCP connection at the bottom through Unwrapper or NetConn and
	// resets it.
	Aborter = netconn.Aborter
	// An Unwrapper passes bytes through unchanged to the connection it
	// returns, adding only methods (identity, a prefix already read), so
	// a relay may copy from and to that one directly and reach its fast
	// paths (splice(2)). A layer that transforms or buffers bytes must
	// not implement it; it offers NetConn instead ([NetConner]).
	Unwrapper = netconn.Unwrapper
)

// A NetConner returns the connection below it, as tls.Conn does, for
// what looks below without reading or writing there: netconn.Abort
// resets the TCP connection at the bottom, netconn.TCPBelow reads its
// byte counts. A layer that transforms bytes implements it; reading or
// writing the connection it returns would corrupt the stream.
type NetConner interface {
	NetConn() net.Conn
}

package layer

import (
	"context"
	"errors"
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

// A DatagramCarrier is a stream whose transport also carries unreliable
// datagrams for it, outside the stream's bytes: QUIC DATAGRAM frames (RFC
// 9221) on the stream's QUIC connection. A datagram sent so arrives
// whole, once or not at all, in any order, and only at the other end of
// the same stream; a lost one is lost alone. The transport's own
// encryption and authentication protect them; the layers above the
// stream (filters) do not apply to them.
//
// It is found by type assertion, through the Unwrapper and NetConner
// chain (DatagramCarrierOf); a stream whose connection does not carry
// datagrams (the peer did not offer them) reports MaxDatagram 0.
type DatagramCarrier interface {
	// SendDatagram sends b as one datagram to the other end of the
	// stream. It may block while the transport's send queue is full;
	// larger than MaxDatagram it may fail with ErrDatagramTooLarge.
	SendDatagram(b []byte) error
	// ReceiveDatagram returns the next datagram that arrived for the
	// stream, waiting for one until ctx ends or the stream is closed
	// (net.ErrClosed).
	ReceiveDatagram(ctx context.Context) ([]byte, error)
	// MaxDatagram is the largest datagram SendDatagram takes now (the
	// path's packet size less the frames' overhead: it may grow as the
	// path's MTU is discovered); 0 when the transport carries none.
	MaxDatagram() int
}

// ErrDatagramTooLarge is matched by a DatagramCarrier's error for a
// datagram that does not fit a packet: the caller sends it another way.
var ErrDatagramTooLarge = errors.New("datagram too large for the transport")

// DatagramCarrierOf returns the DatagramCarrier at or below c, found
// through Unwrapper and NetConner, if it carries datagrams; else nil.
func DatagramCarrierOf(c net.Conn) DatagramCarrier {
	for i := 0; c != nil && i < 64; i++ {
		if dc, ok := c.(DatagramCarrier); ok {
			if dc.MaxDatagram() > 0 {
				return dc
			}
			return nil
		}
		switch w := c.(type) {
		case Unwrapper:
			c = w.UnwrapConn()
		case NetConner:
			c = w.NetConn()
		default:
			return nil
		}
	}
	return nil
}

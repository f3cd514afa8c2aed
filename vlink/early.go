package vlink

import (
	"context"
	"net"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// DialEarly is DialContext for a caller that has the connection's first
// bytes at hand, such as a relay whose client wrote its request as it
// connected. Where the dial's first flight can carry data (a keyed,
// encrypted dial whose listener said it takes early data: ARCHITECTURE
// §2, "Early data"), it calls early for them and sends what it returns
// with the hello, so that the request reaches the target with the first
// flight and its answer comes back with the listener's: two round trips
// to the answer's first byte, TCP's handshake included, where DialContext
// takes three. Elsewhere it never calls early. Either way, what early
// returned is written to the connection when DialEarly returns it: the
// listener may have dropped it from the first flight, and then it went
// again after the handshake. early may return nil.
//
// A refusal, or any failure of the handshake, is DialEarly's error, as
// DialContext's; the bytes may then have reached the listener, as those
// of a connection that fails after a write may.
func (d *Dialer) DialEarly(ctx context.Context, network, address string, early func() []byte) (net.Conn, error) {
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	e := &earlyDial{}
	c, err := d.dial(ctx, network, address, nil, e)
	if err != nil || e.conn == nil {
		return c, err
	}
	_, err = withContext(ctx, c, func() (net.Conn, error) {
		if p := early(); len(p) > 0 {
			// The encryption layer keeps it (through the layers
			// above, which code it as they would any write) for its
			// first message.
			if _, err := c.Write(p); err != nil {
				return nil, err
			}
		}
		return c, e.conn.Handshake()
	})
	if err != nil {
		c.Close()
		return nil, layerDialErr(ctx, e.ff, e.name, network, address, err)
	}
	return c, nil
}

// earlyDial is DialEarly's part of a dial, passed down in its context:
// the hello dialer lets the encryption layer wait for the first bytes
// (layer.Handshake.Early) when the listener takes them, and the layer's
// connection is left here for DialEarly to complete.
type earlyDial struct {
	conn layer.EarlyConn
	name string // its layer's
	ff   layer.FirstFlight
}

type earlyKey struct{}

package netconn

import (
	"net"
	"net/netip"
)

// TCPBelow returns the TCP connection at the bottom of c's wrappers (the
// ones that implement Unwrapper or NetConn, as filters do), or nil when
// there is none: a stream of a multiplexed session, a pipe.
func TCPBelow(c net.Conn) *net.TCPConn { return tcpBelow(c, false) }

// tcpBelow walks down as TCPBelow does; with endsOwn, it stops (nil) at a
// wrapper that frames the stream (an Aborter), whose end of stream is its
// own, not the TCP connection's.
func tcpBelow(c net.Conn, endsOwn bool) *net.TCPConn {
	for c != nil {
		if tc, ok := c.(*net.TCPConn); ok {
			return tc
		}
		if _, ok := c.(Aborter); ok && endsOwn {
			return nil
		}
		switch w := c.(type) {
		case Unwrapper:
			c = w.UnwrapConn()
		case interface{ NetConn() net.Conn }:
			c = w.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// TCPCounts is what the kernel counted on a TCP connection: bytes the
// peer acknowledged, and bytes received, headers and retransmissions left
// out. The kernel counts a FIN as a byte, and the SYN of the side that
// dialed in its Acked: FINAcked and FINReceived say whether the FINs are
// in the counts, so that Data gives the application's bytes.
type TCPCounts struct {
	Acked, Received uint64
	// FINAcked: this side's FIN was sent and acknowledged (in Acked).
	// FINReceived: the peer's FIN came (in Received).
	FINAcked, FINReceived bool
}

// Data returns the application's bytes in the counts: acked and
// received, the FINs left out, and the SYN if this side dialed.
func (c TCPCounts) Data(dialed bool) (acked, received uint64) {
	acked, received = c.Acked, c.Received
	drop := func(n *uint64, yes bool) {
		if yes && *n > 0 {
			*n--
		}
	}
	drop(&acked, dialed)
	drop(&acked, c.FINAcked)
	drop(&received, c.FINReceived)
	return acked, received
}

// ReadTCPCounts reads c's counts from the kernel, at no cost to the data
// path: a relay that splices keeps splicing. ok is false where the
// kernel does not say (not Linux, a closed connection).
func ReadTCPCounts(c *net.TCPConn) (counts TCPCounts, ok bool) {
	return readTCPCounts(c)
}

// AddrPort returns the IP address and port of a TCP or UDP address (a
// QUIC stream's peer is UDP), unmapped from IPv4-in-IPv6.
func AddrPort(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	return netip.AddrPort{}, false
}

package parallelstreams

import (
	"net"

	"github.com/vlink-dev/vlink/netconn"
)

// bottomTCP returns the TCP connection under c's transparent wrappers, if
// any: the socket whose queue is the substream's.
func bottomTCP(c net.Conn) *net.TCPConn {
	for c != nil {
		switch w := c.(type) {
		case *net.TCPConn:
			return w
		case netconn.Unwrapper:
			c = w.UnwrapConn()
		case interface{ NetConn() net.Conn }:
			c = w.NetConn()
		default:
			return nil
		}
	}
	return nil
}

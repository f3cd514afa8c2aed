package testnet

import (
	"net"
	"syscall"
	"testing"
)

// TCPPairBuffers is TCPPair with a small receive buffer at the client
// and a small send buffer at the server, so that what the server writes
// stays on its way until the client reads it: for tests of what a close
// does to bytes still in flight. The receive buffer is set before the
// connection is made: shrunk on an open connection, below the window it
// announced already, it can stall the connection for seconds. The
// caller closes them.
func TCPPairBuffers(tb testing.TB, rcvbuf, sndbuf int) (client, server *net.TCPConn) {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = setRcvbuf(fd, rcvbuf) }); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	client = c.(*net.TCPConn)
	server, err = ln.AcceptTCP()
	if err != nil {
		client.Close()
		tb.Fatal(err)
	}
	if err := server.SetWriteBuffer(sndbuf); err != nil {
		tb.Fatal(err)
	}
	return client, server
}

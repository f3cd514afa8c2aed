package netconn

import (
	"net"

	"golang.org/x/sys/unix"
)

func readTCPCounts(c *net.TCPConn) (TCPCounts, bool) {
	info, ok := tcpInfo(c)
	if !ok {
		return TCPCounts{}, false
	}
	return TCPCounts{Acked: info.Bytes_acked, Received: info.Bytes_received}, true
}

// tcpClosed reports whether c's kernel state is TCP_CLOSE: reset, or ended
// both ways.
func tcpClosed(c *net.TCPConn) bool {
	info, ok := tcpInfo(c)
	return ok && info.State == tcpStateClose
}

func tcpInfo(c *net.TCPConn) (*unix.TCPInfo, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, false
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || serr != nil {
		return nil, false
	}
	return info, true
}

// tcpStateClose is the kernel's TCP_CLOSE.
const tcpStateClose = 7

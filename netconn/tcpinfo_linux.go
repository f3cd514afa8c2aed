package netconn

import (
	"net"

	"golang.org/x/sys/unix"
)

func readTCPCounts(c *net.TCPConn) (TCPCounts, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return TCPCounts{}, false
	}
	var info *unix.TCPInfo
	var serr error
	if err := rc.Control(func(fd uintptr) {
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || serr != nil {
		return TCPCounts{}, false
	}
	return TCPCounts{Acked: info.Bytes_acked, Received: info.Bytes_received}, true
}

// tcpClosed reports whether c's kernel state is TCP_CLOSE: reset, or ended
// both ways.
func tcpClosed(c *net.TCPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var state uint8
	if err := rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	}); err != nil {
		return false
	}
	return state == tcpStateClose
}

// tcpStateClose is the kernel's TCP_CLOSE.
const tcpStateClose = 7

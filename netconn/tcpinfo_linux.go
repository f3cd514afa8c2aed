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
	counts := TCPCounts{Acked: info.Bytes_acked, Received: info.Bytes_received}
	switch info.State {
	case tcpStateFinWait2, tcpStateTimeWait, tcpStateClose:
		counts.FINAcked = true
	}
	switch info.State {
	case tcpStateCloseWait, tcpStateLastAck, tcpStateClosing, tcpStateTimeWait, tcpStateClose:
		counts.FINReceived = true
	}
	// TCP_CLOSE is taken for both FINs crossed; after a reset that takes
	// a byte too many off, never one too few.
	return counts, true
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

// The kernel's TCP states (include/net/tcp_states.h) that say which
// FINs crossed.
const (
	tcpStateFinWait2  = 5
	tcpStateTimeWait  = 6
	tcpStateClose     = 7
	tcpStateCloseWait = 8
	tcpStateLastAck   = 9
	tcpStateClosing   = 11
)

package netconn

import (
	"net"

	"golang.org/x/sys/unix"
)

// tcpBytes returns a function reading how many bytes c's TCP connection
// has received and had acknowledged, or nil if c is not TCP underneath.
func tcpBytes(c net.Conn) func() (uint64, bool) {
	tc := TCPBelow(c)
	if tc == nil {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return func() (uint64, bool) {
		var n uint64
		var ierr error
		if err := rc.Control(func(fd uintptr) {
			var info *unix.TCPInfo
			if info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO); ierr == nil {
				n = info.Bytes_received + info.Bytes_acked
			}
		}); err != nil || ierr != nil {
			return 0, false
		}
		return n, true
	}
}

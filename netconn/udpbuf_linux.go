package netconn

import (
	"net"

	"golang.org/x/sys/unix"
)

// forceUDPBuffers sets the buffers past net.core.[rw]mem_max, which only
// a privileged process may do.
func forceUDPBuffers(udp *net.UDPConn, size int) {
	rc, err := udp.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size)
	})
}

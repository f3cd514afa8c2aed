package quic

import (
	"net"

	"golang.org/x/sys/unix"
)

// forceBuffers sets the socket's buffers past net.core.[rw]mem_max,
// which only a privileged process may do; others keep what they get.
func forceBuffers(udp *net.UDPConn, size int) {
	rc, err := udp.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size)
	})
}

package netconn

import "net"

// SetUDPBuffers asks for socket buffers of size bytes each way on a UDP
// socket, so that a burst waits in the kernel instead of being dropped
// while the reader is not scheduled; as root past the system's limits
// (net.core.rmem_max, wmem_max) on Linux. What the kernel refuses is
// left as it was: a smaller buffer only drops sooner.
func SetUDPBuffers(udp *net.UDPConn, size int) {
	udp.SetReadBuffer(size)
	udp.SetWriteBuffer(size)
	forceUDPBuffers(udp, size)
}

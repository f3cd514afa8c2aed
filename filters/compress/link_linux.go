package compress

import (
	"encoding/binary"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var tcpInfo unix.TCPInfo

const (
	offAcked   = unsafe.Offsetof(tcpInfo.Bytes_acked)
	offNotsent = unsafe.Offsetof(tcpInfo.Notsent_bytes)
	offRwnd    = unsafe.Offsetof(tcpInfo.Rwnd_limited)
	minInfoLen = offNotsent + unsafe.Sizeof(tcpInfo.Notsent_bytes) // Linux 4.6
	tcpInfoLen = offRwnd + unsafe.Sizeof(tcpInfo.Rwnd_limited)     // Linux 4.10
)

// linkSampler returns a function that reads, from a TCP socket's tcp_info,
// how many bytes the peer has acknowledged and how many wait unsent; nil
// for any other connection. It looks through connections that pass bytes
// unchanged (netconn.Unwrapper: a listener's prefixed connection). It
// reuses one buffer, so a sample allocates nothing.
func linkSampler(c net.Conn) func() linkSample {
	for {
		u, ok := c.(interface{ UnwrapConn() net.Conn })
		if !ok {
			break
		}
		c = u.UnwrapConn()
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	// The head of a tcp_info, up to rwnd_limited: the kernel copies what
	// fits. (unix.GetsockoptTCPInfo would allocate a whole one per call.)
	var (
		buf  [tcpInfoLen]byte
		size uint32
	)
	read := func(fd uintptr) {
		size = uint32(len(buf))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&buf)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			size = 0
		}
	}
	return func() linkSample {
		// Kernels before 4.6 have no notsent_bytes: without it the sample
		// is no use.
		if rc.Control(read) != nil || uintptr(size) < minInfoLen {
			return linkSample{}
		}
		s := linkSample{
			acked:   binary.NativeEndian.Uint64(buf[offAcked:]),
			notsent: binary.NativeEndian.Uint32(buf[offNotsent:]),
			ok:      true,
		}
		if uintptr(size) >= tcpInfoLen {
			s.rwndLimited = time.Duration(binary.NativeEndian.Uint64(buf[offRwnd:])) * time.Microsecond
			s.hasRwnd = true
		}
		return s
	}
}

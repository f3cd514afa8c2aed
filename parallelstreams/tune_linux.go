package parallelstreams

import (
	"net"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/netconn"
)

// notSentLowat bounds the bytes a substream's socket holds unsent. The
// scheduler hands a block to whichever substream's write returns first;
// with Linux's send buffers autotuned to many megabytes, every write
// returns at once and a substream slowed by a loss would queue blocks it
// cannot send for a round trip or more, holding back the receiver. With
// TCP_NOTSENT_LOWAT the socket is writable only once its unsent data is
// below the mark, so a write blocks exactly while its path is slow.
const notSentLowat = 128 << 10

// tune sets TCP_NOTSENT_LOWAT on the TCP connection at the bottom of c,
// if there is one.
func tune(c net.Conn) {
	tc := netconn.TCPBelow(c)
	if tc == nil {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, notSentLowat)
	})
}

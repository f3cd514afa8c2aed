package netconn

import (
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// smallCopy is how many bytes of each direction a relay copies with
// read(2) and write(2) before it turns to splice(2). A short exchange (a
// one-byte answer, a request's headers) then costs a read and a write per
// wake-up, where splice costs an ioctl, a peek and two splices through a
// pipe; a bulk transfer passes the limit with its first reads. System
// calls are dear on virtual machines: this saves about five per short
// connection (docs/BENCHMARKS.md §3, "Connect to first byte, out of
// process").
const smallCopy = 4 << 10

// zeroCopy moves bytes from a kernel socket to a destination that
// implements io.ReaderFrom: for a *net.TCPConn (or a wrapper delegating
// to one) that is splice(2), and the bytes never enter the process
// beyond the first smallCopy.
//
// A plain dst.ReadFrom(src) would take the zero-copy path too, but it
// holds a 1 MiB pipe (two descriptors) for the whole connection, idle or
// not. Instead each round waits until src is readable and hands ReadFrom
// exactly the bytes queued, so ReadFrom returns without blocking on src
// and its pipe goes back to the net package's pool.
func zeroCopy(dst, src net.Conn) (n int64, err error, handled bool) {
	rf, ok := dst.(io.ReaderFrom)
	if !ok {
		return 0, nil, false
	}
	rc := rawSource(src)
	if rc == nil {
		return 0, nil, false
	}
	n, err, more := pollCopyUpTo(dst, src, rc, smallCopy)
	if !more {
		return n, err, true
	}
	lr := &io.LimitedReader{R: src}
	for {
		queued, err := readable(src, rc)
		if err != nil || queued == 0 {
			return n, err, true
		}
		lr.N = queued
		m, err := rf.ReadFrom(lr)
		n += m
		if err != nil {
			return n, err, true
		}
		if m == 0 {
			return n, io.ErrNoProgress, true
		}
	}
}

// readable waits until src has bytes or has ended, without reading, and
// returns how many bytes are queued: 0 at the end of the stream.
func readable(src net.Conn, rc syscall.RawConn) (int64, error) {
	var (
		queued int
		serr   error
	)
	err := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		for {
			// While bytes stream in, SIOCINQ alone finds them: the
			// peek runs only when the queue looks empty.
			q, ierr := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
			if ierr == nil && q > 0 {
				queued = q
				return true
			}
			n, _, e := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false // park in the poller
			case e != nil:
				// The peek consumed the socket's pending error; it
				// must be reported here or a reset would read as EOF.
				serr = e
			case n > 0 && ierr == nil:
				continue // arrived since the ioctl
			case n > 0:
				queued = 1
			}
			return true // n == 0: end of stream
		}
	})
	if err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, readError(src, "recvfrom", serr)
	}
	return int64(queued), nil
}

//go:build unix

package netconn

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawSource returns the socket behind src when src is one of the net
// package's stream sockets, whose bytes are all in the kernel. A wrapper
// that offers SyscallConn may hold bytes of its own, so it is not used.
func rawSource(src net.Conn) syscall.RawConn {
	var rc syscall.RawConn
	var err error
	switch c := src.(type) {
	case *net.TCPConn:
		rc, err = c.SyscallConn()
	case *net.UnixConn:
		if c.LocalAddr().Network() != "unix" {
			return nil
		}
		rc, err = c.SyscallConn()
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	return rc
}

// pollCopy copies from a kernel socket, taking a pooled buffer only when
// the socket has bytes: the read is tried without blocking, and on EAGAIN
// the buffer goes back to the pool before the goroutine parks in the
// poller. It handles src only if rawSource does.
func pollCopy(dst, src net.Conn) (n int64, err error, handled bool) {
	rc := rawSource(src)
	if rc == nil {
		return 0, nil, false
	}
	n, err, _ = pollCopyUpTo(dst, src, rc, 0)
	return n, err, true
}

// pollCopyUpTo is pollCopy's loop, on src's socket rc. With a limit > 0
// it returns once it copied limit bytes or more, with more set: the
// stream goes on. Otherwise it copies to the end of src (a nil error) or
// a failure.
func pollCopyUpTo(dst, src net.Conn, rc syscall.RawConn, limit int64) (n int64, err error, more bool) {
	var (
		buf  *[relayBufSize]byte
		nr   int
		rerr error
	)
	read := func(fd uintptr) bool {
		buf = relayBufs.Get().(*[relayBufSize]byte)
		p := buf[:]
		if limit > 0 {
			p = buf[:min(int64(len(p)), limit-n)]
		}
		for {
			nr, rerr = unix.Read(int(fd), p)
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			relayBufs.Put(buf)
			buf = nil
			return false // wait until readable, holding nothing
		}
		return true
	}
	for {
		if limit > 0 && n >= limit {
			return n, nil, true
		}
		if err := rc.Read(read); err != nil {
			return n, err, false // closed or past a deadline; buf is back
		}
		if rerr != nil || nr <= 0 {
			relayBufs.Put(buf)
			if rerr != nil {
				return n, readError(src, "read", rerr), false
			}
			return n, nil, false // end of stream
		}
		nw, werr := dst.Write(buf[:nr])
		relayBufs.Put(buf)
		n += int64(nw)
		if werr != nil {
			return n, werr, false
		}
		if nw != nr {
			return n, io.ErrShortWrite, false
		}
	}
}

// readError reports a failed system call on src's read side the way the
// net package does.
func readError(src net.Conn, syscallName string, errno error) error {
	return &net.OpError{Op: "read", Net: src.LocalAddr().Network(), Source: src.LocalAddr(),
		Addr: src.RemoteAddr(), Err: os.NewSyscallError(syscallName, errno)}
}

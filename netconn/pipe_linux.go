package netconn

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A Pipe carries bytes from one socket to another inside the kernel
// (splice(2)): a layer that frames a stream moves a payload it does not
// need to look at this way, writing only its header itself. A Pipe is
// taken from a pool with GetPipe and given back with Put; it belongs to
// one goroutine at a time.
type Pipe struct {
	r, w    int // the pipe's read and write ends
	n       int // bytes in the pipe
	cleanup runtime.Cleanup

	// The poller's callbacks, made once per pipe (a closure made per
	// call would be an allocation per splice), and the arguments and
	// results of the call in progress.
	fill, drain, send func(fd uintptr) bool
	max, flags, done  int
	wait              bool
	buf               []byte
	errno             error
}

// pipeSize is what a pipe is asked to hold, as the net package's own
// splice does: a socket's bytes go in as one pipe slot per page fragment
// of its buffers, so the default 16 slots would cut a frame's payload
// into many splices. Where the kernel refuses (fs.pipe-max-size), the
// pipe keeps its default size and splices return shorter counts.
const pipeSize = 1 << 20

var pipes = sync.Pool{New: func() any {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return err
	}
	unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pipeSize)
	p := &Pipe{r: fds[0], w: fds[1]}
	p.fill, p.drain, p.send = p.fillFD, p.drainFD, p.sendFD
	// A pipe the pool drops is closed by the collector. (A finalizer
	// would never run: the callbacks make p a cycle.)
	p.cleanup = runtime.AddCleanup(p, closePipe, fds)
	return p
}}

// GetPipe returns an empty pipe from the pool, or the error pipe2(2)
// gave (out of descriptors).
func GetPipe() (*Pipe, error) {
	switch v := pipes.Get().(type) {
	case *Pipe:
		return v, nil
	case error:
		return nil, os.NewSyscallError("pipe2", v)
	}
	panic("unreachable")
}

// Put gives p back to the pool if it is empty, and closes it otherwise:
// bytes left in a pipe belong to a stream that failed.
func (p *Pipe) Put() {
	p.buf, p.errno = nil, nil
	if p.n != 0 {
		p.cleanup.Stop()
		closePipe([2]int{p.r, p.w})
		return
	}
	pipes.Put(p)
}

func closePipe(fds [2]int) {
	unix.Close(fds[0])
	unix.Close(fds[1])
}

// Len returns the bytes in the pipe.
func (p *Pipe) Len() int { return p.n }

// RawSocket returns the socket behind c when c is a kernel stream
// socket whose bytes are all the kernel's (*net.TCPConn, stream
// *net.UnixConn), the only kind a Pipe splices from or to; nil otherwise.
func RawSocket(c net.Conn) syscall.RawConn { return rawSource(c) }

// Readable waits until the socket c (RawSocket's, rc) has bytes or has
// ended, without reading, and returns how many bytes are queued: 0 at the
// end of the stream.
func Readable(c net.Conn, rc syscall.RawConn) (int64, error) { return readable(c, rc) }

// Fill moves at most max bytes from the socket c (RawSocket's, rc) into
// the pipe. With wait, it waits until c has bytes, as Read does; without,
// it returns 0 and a nil error when c has none now. At the end of c's
// stream it returns io.EOF. Errors are c's read errors, as the net
// package reports them.
func (p *Pipe) Fill(c net.Conn, rc syscall.RawConn, max int, wait bool) (int, error) {
	p.max, p.wait, p.done, p.errno = max, wait, 0, nil
	err := rc.Read(p.fill)
	switch {
	case err != nil:
		return 0, err
	case p.errno == unix.EAGAIN:
		return 0, nil
	case p.errno != nil:
		return 0, readError(c, "splice", p.errno)
	case p.done == 0:
		return 0, io.EOF
	}
	p.n += p.done
	return p.done, nil
}

func (p *Pipe) fillFD(fd uintptr) bool {
	for {
		k, err := unix.Splice(int(fd), nil, p.w, nil, p.max, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		if err == unix.EINTR {
			continue
		}
		p.done, p.errno = int(k), err
		return err != unix.EAGAIN || !p.wait // false: park until readable
	}
}

// Drain moves every byte in the pipe to the socket c (RawSocket's, rc),
// waiting for room as Write does, and returns how many it moved. With
// more, the kernel holds the last segment back for what the caller
// writes next (SPLICE_F_MORE). On an error the bytes not moved stay in
// the pipe: ReadOut takes them.
func (p *Pipe) Drain(c net.Conn, rc syscall.RawConn, more bool) (int, error) {
	p.flags, p.done, p.errno = unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK, 0, nil
	if more {
		p.flags |= unix.SPLICE_F_MORE
	}
	err := rc.Write(p.drain)
	if err == nil && p.errno != nil {
		err = writeError(c, "splice", p.errno)
	}
	return p.done, err
}

func (p *Pipe) drainFD(fd uintptr) bool {
	for p.n > 0 {
		k, err := unix.Splice(p.r, nil, int(fd), nil, p.n, p.flags)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // park until writable
		case err != nil:
			p.errno = err
			return true
		}
		p.n -= int(k)
		p.done += int(k)
	}
	return true
}

// Send writes b to the socket c (RawSocket's, rc), waiting for room as
// Write does, with MSG_MORE: the kernel holds it back to go out with what
// follows (a frame's header with the payload Drain splices after it)
// rather than in a segment of its own. It returns how many bytes it
// wrote; the pipe's bytes are not touched.
func (p *Pipe) Send(c net.Conn, rc syscall.RawConn, b []byte) (int, error) {
	p.buf, p.done, p.errno = b, 0, nil
	err := rc.Write(p.send)
	p.buf = nil
	if err == nil && p.errno != nil {
		err = writeError(c, "sendmsg", p.errno)
	}
	return p.done, err
}

func (p *Pipe) sendFD(fd uintptr) bool {
	for p.done < len(p.buf) {
		k, err := unix.SendmsgN(int(fd), p.buf[p.done:], nil, nil, unix.MSG_MORE|unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false // park until writable
		case err != nil:
			p.errno = err
			return true
		}
		p.done += k
	}
	return true
}

// ReadOut reads up to len(b) bytes of the pipe into b: what a failed
// Drain left, for a caller that must keep it.
func (p *Pipe) ReadOut(b []byte) (int, error) {
	n := 0
	for n < len(b) && p.n > 0 {
		k, err := unix.Read(p.r, b[n:min(len(b), n+p.n)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, os.NewSyscallError("read", err)
		}
		if k == 0 {
			return n, errors.New("netconn: pipe ended with bytes counted in it")
		}
		n += k
		p.n -= k
	}
	return n, nil
}

// writeError reports a failed system call on c's write side the way the
// net package does.
func writeError(c net.Conn, syscallName string, errno error) error {
	return &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(),
		Addr: c.RemoteAddr(), Err: os.NewSyscallError(syscallName, errno)}
}

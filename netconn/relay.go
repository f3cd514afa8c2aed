package netconn

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// relayBufSize is the size of the buffers relays copy through when the
// kernel cannot move the bytes itself; io.Copy uses the same.
const relayBufSize = 32 << 10

// relayBufs holds the copy buffers. A relay takes one only when the
// source has bytes to read and puts it back after writing them, so idle
// relays hold none.
var relayBufs = sync.Pool{New: func() any { return new([relayBufSize]byte) }}

// Relay copies a to b and b to a until both directions are done, then
// closes a and b. It returns the byte counts of each direction and the
// first error either direction met; reaching the end of a stream is not
// an error.
//
// When one direction reaches the end of its source, Relay half-closes the
// destination (CloseWrite) so the peer sees the end while the other
// direction goes on; a destination without CloseWrite is closed. When a
// direction fails, Relay aborts both connections (see [Abort]: a TCP
// connection is reset, so its peer sees a failure rather than an end of
// stream) and the other direction does not hang; the net.ErrClosed this
// teardown causes is not reported. A reset is passed on as a reset even
// when the kernel gave its error to the write in one direction and an
// end of stream to the read in the other (on Linux; see hiddenReset).
//
// A peer that ended its own stream and then reset the connection rather
// than read the end of ours (it closed early, as an HTTP client done
// with its response may) is a normal end: Relay reports no error and
// closes both sides as after any end. It does not pass the reset on: an
// abort would throw away what the other side's socket has not sent yet
// of a stream that ended whole.
//
// Relay picks the cheapest copy each direction allows:
//   - on Linux, from a *net.TCPConn (or stream *net.UnixConn) to a
//     destination implementing io.ReaderFrom (a *net.TCPConn, or a wrapper
//     delegating to one): after the first 4 KiB, copied with read(2) and
//     write(2) (fewer system calls for a short exchange), the kernel's
//     zero-copy path (splice(2)), the bytes never enter the process. A
//     layer that frames the stream may splice its payloads the same way
//     (the compression layers' ReadFrom, through a Pipe).
//     Relay waits until the source is readable and calls ReadFrom with an
//     *io.LimitedReader of just the bytes queued, so an idle direction
//     holds no splice(2) pipe either;
//   - from a source implementing io.WriterTo other than *net.TCPConn: its
//     WriteTo, which is trusted to hold no buffer while idle (the
//     compression filters' holds none);
//   - on Unix, from a *net.TCPConn (or stream *net.UnixConn) to any other
//     destination: a pooled buffer, taken only once the socket is readable;
//   - otherwise a pooled buffer, held while Read blocks.
//
// Relay sets no deadline: an idle limit is the caller's to set.
func Relay(a, b net.Conn) (aToB, bToA int64, err error) {
	r := &relay{a: a, b: b}
	done := make(chan struct{})
	go func() {
		defer close(done)
		bToA = r.run(a, b, &r.aEnded, &r.bEnded)
	}()
	aToB = r.run(b, a, &r.bEnded, &r.aEnded)
	<-done
	a.Close()
	b.Close()
	return aToB, bToA, r.err
}

// relay is the state the two directions of one Relay share.
type relay struct {
	a, b net.Conn

	mu  sync.Mutex
	err error // the first real error
	// closed is set once Relay closed a connection itself: a net.ErrClosed
	// after it is Relay's own doing, not the peer's.
	closed bool
	torn   bool // both connections closed after a failure
	// aEnded and bEnded are set, before the half-close, once Relay passes
	// an end on to a's or b's peer.
	aEnded, bEnded bool
}

// run copies src to dst and passes the end of src on to dst's peer.
func (r *relay) run(dst, src net.Conn, dstEnded, srcEnded *bool) int64 {
	n, err := copyConn(dst, src)
	if err == nil {
		err = r.hiddenReset(src, srcEnded)
	}
	if err == nil {
		r.mu.Lock()
		torn := r.torn
		*dstEnded = !torn
		r.mu.Unlock()
		if torn {
			// The other direction failed, maybe on the reset this end
			// hides, and is aborting both: no end to pass on.
			return n
		}
		if err = r.closeWrite(dst); err != nil && ResetByPeer(err) {
			// The peer reset after its own end, or before it: the other
			// direction's read from dst ends at once, cleanly or with
			// the reset, and says which. No teardown here.
			return n
		}
	}
	if err != nil {
		r.fail(err)
	}
	return n
}

// ResetByPeer reports whether err is what a write or a half-close gets
// once the peer has reset the connection.
func ResetByPeer(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// hiddenReset returns the reset that ended src when its end of stream
// was one. The kernel reports a TCP reset to one call only: when the
// other direction's write to src takes it, the read finds what looks like
// an end of stream, and passing that on (a FIN) would tell dst's peer
// that a stream cut short was whole. A connection that has seen a reset
// is closed in the kernel (TCP_CLOSE), while one the peer only ended waits
// for our end (CLOSE_WAIT) unless Relay passed that on already (then it
// is closed either way, and nothing raced for the error). Framed layers
// (Aborters) read their own end markers and are trusted. Linux only.
func (r *relay) hiddenReset(src net.Conn, srcEnded *bool) error {
	tc := tcpBelow(src, true)
	if tc == nil || !tcpClosed(tc) {
		return nil
	}
	r.mu.Lock()
	ended := *srcEnded
	r.mu.Unlock()
	if ended {
		return nil
	}
	return &net.OpError{Op: "read", Net: "tcp", Source: tc.LocalAddr(), Addr: tc.RemoteAddr(),
		Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}

func (r *relay) closeWrite(c net.Conn) error {
	for w := c; ; {
		if cw, ok := w.(CloseWriter); ok {
			return cw.CloseWrite()
		}
		u, ok := w.(Unwrapper)
		if !ok {
			break
		}
		w = u.UnwrapConn()
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return c.Close()
}

// fail records err unless Relay caused it, and tears both connections
// down once.
func (r *relay) fail(err error) {
	r.mu.Lock()
	ours := r.torn || (r.closed && (errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe)))
	if !ours && r.err == nil {
		r.err = err
	}
	first := !r.torn
	r.torn, r.closed = true, true
	r.mu.Unlock()
	if first {
		// Abort rather than close: a peer must not take a stream cut
		// short by a failure on the other side for a complete one.
		Abort(r.a)
		Abort(r.b)
	}
}

// copyConn copies src to dst until the end of src (a nil error) or a
// failure.
func copyConn(dst, src net.Conn) (int64, error) {
	src, dst, n, err := unwrap(dst, src)
	if err != nil {
		return n, err
	}
	m, err := copyUnwrapped(dst, src)
	return n + m, err
}

// unwrap strips transparent wrappers from both ends, so the copy reaches
// the fast paths of the connections below; a prefix a listener read
// ahead is written to dst first.
func unwrap(dst, src net.Conn) (net.Conn, net.Conn, int64, error) {
	var n int64
	for {
		switch c := src.(type) {
		case *prefixConn:
			if len(c.prefix) > 0 {
				m, err := dst.Write(c.prefix)
				n += int64(m)
				c.prefix = c.prefix[m:]
				if err != nil {
					return src, dst, n, err
				}
			}
			src = c.Conn
			continue
		case Unwrapper:
			src = c.UnwrapConn()
			continue
		}
		break
	}
	for {
		u, ok := dst.(Unwrapper)
		if !ok {
			break
		}
		dst = u.UnwrapConn()
	}
	return src, dst, n, nil
}

func copyUnwrapped(dst, src net.Conn) (int64, error) {
	if n, err, ok := zeroCopy(dst, src); ok {
		return n, err
	}
	if wt, ok := src.(io.WriterTo); ok {
		// *net.TCPConn's WriteTo copies through a buffer it holds for
		// the whole connection unless it takes the zero-copy path, which
		// zeroCopy already tried.
		if _, isTCP := src.(*net.TCPConn); !isTCP {
			return wt.WriteTo(dst)
		}
	}
	if n, err, ok := pollCopy(dst, src); ok {
		return n, err
	}
	return bufCopy(dst, src)
}

// bufCopy is io.Copy through a pooled buffer. The buffer is held while
// Read blocks: nothing tells when a generic connection is readable.
func bufCopy(dst io.Writer, src io.Reader) (n int64, err error) {
	buf := relayBufs.Get().(*[relayBufSize]byte)
	defer relayBufs.Put(buf)
	for {
		nr, rerr := src.Read(buf[:])
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
			if nw != nr {
				return n, io.ErrShortWrite
			}
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// Package framed gives a framed layer the ends of a socket: a layer that
// cuts the stream into frames of its own (compression, noise, vio's
// Stream) and ends it with an end marker of its own, so that its peer
// tells the end of the stream from a stream cut short.
//
// A layer holds an [Ends] beside its framing and supplies only what is
// its own ([Framing]: send the end marker, send or drop what a deadline
// left of a frame, release its read buffers); Ends gives it the rest, the
// same for every framed layer:
//
//   - Close sends the end marker, in the background for up to
//     [CloseLinger] when the peer does not read, as the kernel lingers on
//     a TCP close, then closes the connection below. It never waits for a
//     Write: if one is in progress, or one failed, the stream is cut short
//     and no end marker is sent, so the peer reads an error, never io.EOF
//     after a stream that lost its tail.
//   - Abort closes without the end marker (after the layer's abort
//     marker, if it has one: [AbortWriter]) and aborts the connection
//     below ([netconn.Abort]), so the peer sees a failure.
//   - CloseWrite sends the end marker, then half-closes the connection
//     below if it can.
//   - After the peer's end marker, the connection below is read on to
//     its end, keeping nothing, in the background (the tail reader, see
//     [Ends.PeerEnded]), and a Close waits for that for up to a second
//     and 64 KiB. It is the end of the layer below (noise's end record
//     under compression, compression's end frame under noise, mux's end
//     record): a socket closed with bytes unread is reset by the kernel,
//     which throws away what it had not sent yet, and the peer would lose
//     the end of what this side wrote; and mux learns only by reading
//     past its end record that its peer closed the stream for good, which
//     fails this side's writes as a TCP reset does.
//   - Use after Close is net.ErrClosed in a *net.OpError naming the
//     layer; Close unblocks any Read or Write at once.
//
// Every framed layer, and shm, whose end markers are its own, reports a
// stream that did not end with its marker through an error matching
// [ErrReset], and so syscall.ECONNRESET, as a TCP reset and quic's
// ErrReset do.
package framed

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// A Framing is a framed layer's own part of its ends. Ends calls the
// write methods with the write lock held, ReleaseRead with the read lock
// held.
type Framing interface {
	// WriteEnd writes the end marker and reports whether the peer will
	// get it: true once it was sent whole, or in part with its rest kept
	// as the tail that FlushTail sends, as for any frame a deadline cut.
	WriteEnd() (sent bool, err error)
	// FlushTail sends what a deadline left of the last frame written,
	// if anything.
	FlushTail() error
	// DropTail forgets that rest: the stream is cut.
	DropTail()
	// ReleaseRead returns the read side's buffers: the connection is
	// closed and no Read will need them.
	ReleaseRead()
}

// An AbortWriter is a Framing with a marker of its own for an abort (vio's
// Stream over a message transport, which has no reset to send): Abort
// sends it before it closes, unless a Write is in progress or the end
// marker was sent.
type AbortWriter interface {
	WriteAbort() error
}

// Below is what Ends needs of the connection under the layer; a net.Conn
// has it. CloseWrite (a half-close), Read (the tail reader after the
// peer's end) and Abort are used where the connection has them.
type Below interface {
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	Close() error
}

// CloseLinger bounds how long a closed connection still tries to send its
// end marker to a peer that does not read.
const CloseLinger = 10 * time.Second

// After the peer's end marker, the tail reader reads at most maxEndDrain
// bytes from the connection below, and a close waits for it for up to
// endDrain.
const (
	endDrain    = time.Second
	maxEndDrain = 64 << 10
)

// abortBound bounds how long Abort tries to send an abort marker.
const abortBound = time.Second

var (
	// ErrReset is matched by the error of a read from a stream that its
	// peer did not end: the peer aborted it, or the connection below ended
	// without the end marker (the peer's process died, a hop cut the
	// stream short). What was read is not the whole stream. It matches
	// syscall.ECONNRESET too, as a TCP connection's reset does, so one test
	// tells a reset on any transport.
	ErrReset error = &resetError{msg: "stream reset by peer"}
	// ErrNoEnd is the error of a read from a stream whose connection below
	// ended without the end marker. It matches ErrReset and
	// io.ErrUnexpectedEOF.
	ErrNoEnd error = &resetError{msg: "the stream ended without its end marker", cause: io.ErrUnexpectedEOF}
	// ErrWriteShut is the error of a write after CloseWrite. It matches
	// net.ErrClosed, and syscall.EPIPE as a socket's does.
	ErrWriteShut error = &writeShutError{}
)

type resetError struct {
	msg   string
	cause error
}

func (e *resetError) Error() string { return e.msg }
func (e *resetError) Unwrap() error { return e.cause }
func (e *resetError) Is(target error) bool {
	return target == ErrReset || target == syscall.ECONNRESET
}

type writeShutError struct{}

func (*writeShutError) Error() string {
	return "use of closed network connection: write side shut down"
}
func (*writeShutError) Is(target error) bool {
	return target == net.ErrClosed || target == syscall.EPIPE
}

// Ends is a framed connection's life: its open or closed state, the
// locks of its read and write sides, and its ends (Close, Abort,
// CloseWrite), which a layer's connection forwards to it. Init it before
// use; it must not be copied after.
//
// The layer's Read holds the read lock (LockRead) and its Write the write
// lock (LockWrite), so one of each may run at a time; Close and Abort take
// neither, and unblock both through the connection below.
type Ends struct {
	below Below
	name  string
	f     Framing

	closed atomic.Bool
	// peerEnded: the peer's end marker was read. What it sends after (the
	// end of the layer below) is read by the tail reader (PeerEnded).
	peerEnded atomic.Bool
	// The tail reader's: tailDone is closed when it is done, tailOver set
	// before if it read below to its end or its bound, so that a close
	// reads no more. tailDone is written before peerEnded is set; nil if
	// below is no io.Reader.
	tailDone chan struct{}
	tailOver atomic.Bool
	// dmu orders the tail reader's start with the caller's read
	// deadlines, which no longer reach below once it runs (tailing).
	dmu     sync.Mutex
	tailing bool
	// readFailed: the read side failed for good (see ReadFailed).
	readFailed atomic.Bool

	rmu      sync.Mutex
	wmu      sync.Mutex
	werr     error // under wmu; sticky: a write failed and the stream is broken
	wshut    bool  // under wmu: the end marker was written (or is in the tail)
	shutDone bool  // under wmu: and below was half-closed
}

// Init readies e for a connection over below, for the layer called name
// (the Net of its errors) framing as f says.
func (e *Ends) Init(below Below, name string, f Framing) {
	e.below, e.name, e.f = below, name, f
}

// OpError returns err as the layer's *net.OpError for op.
func (e *Ends) OpError(op string, err error) error {
	return &net.OpError{Op: op, Net: e.name, Source: e.below.LocalAddr(), Addr: e.below.RemoteAddr(), Err: err}
}

// Closed reports whether Close or Abort was called.
func (e *Ends) Closed() bool { return e.closed.Load() }

// LockRead takes the read side's lock, which a Read holds throughout.
func (e *Ends) LockRead() { e.rmu.Lock() }

// UnlockRead releases it.
func (e *Ends) UnlockRead() { e.rmu.Unlock() }

// LockWrite takes the write side's lock, which a Write holds throughout.
func (e *Ends) LockWrite() { e.wmu.Lock() }

// UnlockWrite releases it.
func (e *Ends) UnlockWrite() { e.wmu.Unlock() }

// ReadClosed returns nil while the connection is open. Once it is closed,
// it releases the read buffers and returns what a Read returns then:
// net.ErrClosed in a *net.OpError. The read lock is held.
func (e *Ends) ReadClosed() error {
	if !e.closed.Load() {
		return nil // inlined: the check every Read makes
	}
	return e.readClosed()
}

func (e *Ends) readClosed() error {
	e.f.ReleaseRead()
	return e.OpError("read", net.ErrClosed)
}

// PeerEnded records that the peer's end marker was read; the layer reads
// nothing from below after it. The read lock is held.
//
// A goroutine, the tail reader, then reads on from below, keeping
// nothing, until its end (or maxEndDrain bytes), so that the layer below
// sees its own end as soon as it comes rather than at Close. A socket
// then holds no unread bytes when it is closed (see drainClose); and a
// layer below may learn only by reading that its peer is gone: a mux
// stream reads its peer's close mark, which fails its writes with EPIPE
// once the peer closed the stream for good (an abort after a
// half-close), only when read past its end record. Without the tail
// reader, a layer above mux whose peer half-closed, then aborted, would
// write on into a mux window that nobody opens again (issue 38). What
// the layer below learns reaches the layer's user through its writes,
// which fail; its reads have ended already. The caller's read deadlines
// stop reaching below (SetReadDeadline): the layer's reads end at the end
// marker without reading there, and the tail reader ends only with the
// connection (Close, Abort) or below's end.
func (e *Ends) PeerEnded() {
	if e.peerEnded.Load() {
		return
	}
	if r, ok := e.below.(io.Reader); ok {
		e.dmu.Lock()
		e.tailing = true
		e.below.SetReadDeadline(time.Time{})
		e.dmu.Unlock()
		e.tailDone = make(chan struct{})
		go e.readTail(r)
	}
	e.peerEnded.Store(true)
}

// readTail is the tail reader (see PeerEnded). A deadline stops it only
// when Close set one, and then drainClose reads on.
func (e *Ends) readTail(r io.Reader) {
	defer close(e.tailDone)
	var buf [512]byte
	for n := 0; n < maxEndDrain; {
		k, err := r.Read(buf[:])
		n += k
		if err != nil {
			e.tailOver.Store(!errors.Is(err, os.ErrDeadlineExceeded))
			return
		}
	}
	e.tailOver.Store(true)
}

// SetReadDeadline sets the read deadline of the connection below, for
// the layer's reads: a layer's SetReadDeadline calls it. Once the tail
// reader runs (see PeerEnded), nothing reads below for the caller and
// the deadline is not passed on.
func (e *Ends) SetReadDeadline(t time.Time) error {
	e.dmu.Lock()
	defer e.dmu.Unlock()
	if !e.tailing {
		return e.below.SetReadDeadline(t)
	}
	if e.closed.Load() {
		return e.OpError("set", net.ErrClosed)
	}
	return nil
}

// SetDeadline sets both deadlines of the connection below, the read
// deadline as SetReadDeadline does: a layer's SetDeadline calls it.
func (e *Ends) SetDeadline(t time.Time) error {
	if err := e.SetReadDeadline(t); err != nil {
		return err
	}
	return e.below.SetWriteDeadline(t)
}

// ReadFailed records that the read side failed for good, mid-stream: a
// record that did not authenticate or decode, a stream cut before its
// end marker. Close then aborts rather than sending the end marker, as
// a socket closed with bytes unread is reset: the peer, whose stream did
// not arrive whole, must not read a clean end. The read lock is held.
func (e *Ends) ReadFailed() { e.readFailed.Store(true) }

// ReadErr records an error the connection below returned to a Read: one
// that is not a deadline's means the stream below failed (a reset, a
// layer below whose records did not authenticate), and so the read side
// did too (ReadFailed). The read lock is held.
func (e *Ends) ReadErr(err error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		e.readFailed.Store(true)
	}
}

// Writable returns why a Write cannot start, or nil: the connection is
// closed (net.ErrClosed), a write failed (that failure) or the writing
// side was shut down (ErrWriteShut). The write lock is held.
func (e *Ends) Writable() error {
	if !e.closed.Load() && e.werr == nil && !e.wshut {
		return nil // inlined: the check every Write makes
	}
	return e.notWritable()
}

func (e *Ends) notWritable() error {
	switch {
	case e.closed.Load():
		e.f.DropTail()
		return e.OpError("write", net.ErrClosed)
	case e.werr != nil:
		return e.werr
	}
	return e.OpError("write", ErrWriteShut)
}

// WriteErr sorts an error of a write to the connection below, and
// returns what the layer's Write returns. A deadline leaves the stream
// usable; any other error breaks it for good (FailWrite); after Close, it
// is net.ErrClosed. The write lock is held.
func (e *Ends) WriteErr(err error) error {
	if e.closed.Load() {
		e.f.DropTail()
		return e.OpError("write", net.ErrClosed)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		e.FailWrite(err)
	}
	return err
}

// FailWrite breaks the write side for good: later writes, CloseWrite and
// Close get err, and no end marker is sent. It returns err. The write
// lock is held.
func (e *Ends) FailWrite(err error) error {
	e.werr = err
	e.f.DropTail()
	return err
}

// CloseWrite shuts down the writing side: it sends the end marker, after
// which the peer reads io.EOF, and half-closes the connection below if it
// can. Over a connection that cannot half-close, the end marker alone
// gives the peer its EOF. Calling it again does nothing.
func (e *Ends) CloseWrite() error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.closed.Load() {
		e.f.DropTail()
		return e.OpError("close", net.ErrClosed)
	}
	if err := e.sendEnd(); err != nil {
		return err
	}
	if !e.shutDone {
		e.shutDone = true
		if cw, ok := e.below.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite()
		}
	}
	return nil
}

// sendEnd sends what a deadline left of the last frame and the end
// marker, unless it was sent. The write lock is held.
func (e *Ends) sendEnd() error {
	if e.werr != nil {
		return e.werr
	}
	if !e.wshut {
		if err := e.f.FlushTail(); err != nil {
			return err
		}
		sent, err := e.f.WriteEnd()
		e.wshut = sent
		if err != nil {
			return err
		}
	}
	return e.f.FlushTail()
}

// Close closes the connection as a socket's close does: unless the
// writing side was shut down already, the end marker is still sent, in
// the background for up to CloseLinger, so the peer reads what was
// written and then io.EOF. If a Write is in progress or failed, the
// stream is cut short and no end marker is sent: the peer's Read fails.
// So it is after the read side failed (ReadFailed): Close aborts.
// Close unblocks any Read or Write at once; later calls return an error
// matching net.ErrClosed.
func (e *Ends) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return e.OpError("close", net.ErrClosed)
	}
	if e.readFailed.Load() {
		return e.abort()
	}
	// A Write in progress holds wmu: Close must not wait for it.
	if e.wmu.TryLock() {
		if !e.wshut && e.werr == nil {
			netconn.InterruptRead(e.below)
			go e.lingerClose()
			return nil
		}
		e.f.DropTail()
		e.wmu.Unlock()
		if e.peerEnded.Load() {
			go func() { e.closeBelow(e.drainClose()) }()
			return nil
		}
	}
	return e.closeBelow(e.below.Close())
}

// lingerClose sends the end marker, then closes the connection below. It
// holds wmu, which Close took.
func (e *Ends) lingerClose() {
	defer e.wmu.Unlock()
	e.below.SetWriteDeadline(time.Now().Add(CloseLinger))
	e.sendEnd()
	e.f.DropTail()
	if e.peerEnded.Load() {
		e.closeBelow(e.drainClose())
		return
	}
	e.closeBelow(e.below.Close())
}

// drainClose closes the connection below once the tail reader has read
// what the peer sent after its end marker, for up to endDrain: the end of
// the layer below, which its CloseWrite sends a moment later. A socket
// closed with bytes unread is reset by the kernel, which throws away what
// it had not sent yet: the peer would lose the end of what we wrote. If
// Close's interruption (InterruptRead) stopped the tail reader, it reads
// on itself.
func (e *Ends) drainClose() error {
	if r, ok := e.below.(io.Reader); ok {
		e.below.SetReadDeadline(time.Now().Add(endDrain))
		<-e.tailDone
		if e.tailOver.Load() {
			return e.below.Close()
		}
		var buf [512]byte
		for n := 0; n < maxEndDrain; {
			k, err := r.Read(buf[:])
			n += k
			if err != nil {
				break
			}
		}
	}
	return e.below.Close()
}

// Abort closes the connection without its end marker and aborts the one
// below (netconn.Abort), so the peer sees a failure, never an end of
// stream: relays and multi-link layers call it when the other side of a
// stream failed. A Framing that is an AbortWriter sends its abort marker
// first, for up to a second.
func (e *Ends) Abort() error {
	if !e.closed.CompareAndSwap(false, true) {
		return e.OpError("close", net.ErrClosed)
	}
	return e.abort()
}

func (e *Ends) abort() error {
	if e.wmu.TryLock() {
		e.f.DropTail()
		if a, ok := e.f.(AbortWriter); ok && !e.wshut && e.werr == nil {
			e.below.SetWriteDeadline(time.Now().Add(abortBound))
			a.WriteAbort()
		}
		e.wmu.Unlock()
	}
	return e.closeBelow(abortBelow(e.below))
}

func abortBelow(b Below) error {
	switch b := b.(type) {
	case net.Conn:
		return netconn.Abort(b)
	case netconn.Aborter:
		return b.Abort()
	}
	return b.Close()
}

// closeBelow returns the read buffers once the connection below is
// closed, unless a Read holds them: that one returns them when it sees
// the close.
func (e *Ends) closeBelow(err error) error {
	if e.rmu.TryLock() {
		e.f.ReleaseRead()
		e.rmu.Unlock()
	}
	return err
}

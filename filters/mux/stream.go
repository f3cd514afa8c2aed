package mux

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xtaci/smux"

	"github.com/vlink-dev/vlink/netconn"
)

// stream is a smux stream with the net.Conn contract filled in: smux
// reports timeouts with its own error and use after close as
// io.ErrClosedPipe, and lets a write with a passed deadline through when
// the window has room.
//
// Writes are also serialized here. smux v1.5.58 counts a frame as written
// only after handing it to the session, so with two writers on one
// stream, one can see the peer's acknowledgement of the other's frame
// before that frame is counted, and smux then fails the whole session
// with ErrConsumed ("peer consumed more than sent"). One writer at a time
// closes that window; it costs nothing a TCP socket does not also do (its
// writes are serialized by the kernel's socket lock).
//
// smux's own write deadline cannot be used: a write that gives up on it
// may leave its frame queued, to be sent later from the caller's buffer
// (which the caller is free to reuse) and not counted in the n it
// returned, so a caller that retries sends the bytes twice. Instead the
// stream keeps a send buffer of one chunk, as a socket keeps its send
// buffer: Write copies each chunk into a buffer of its own and hands it
// to smux from a goroutine, with no deadline, and counts it as written
// from then on; only the wait for the chunk before it obeys the deadline.
// Each chunk is one record (frame.go), its header in front of the data in
// the same buffer.
//
// Once the peer's records have ended (its end record came: Read returned
// io.EOF), a goroutine of the stream's, the drainer, reads on from smux
// until the stream's end there, for the close mark that says the peer
// closed the stream for good (frame.go); it keeps nothing of what it
// reads. A smux Write then waiting for the peer's window is woken by
// smux's write deadline, which the stream sets for that alone: that the
// frame it gives up on may still go out does no harm then (the peer drops
// it, and the chunk's buffer is not used again after an error).
type stream struct {
	st *smux.Stream

	closed      atomic.Bool
	closing     chan struct{} // closed by Close, for writers waiting their turn
	writeClosed atomic.Bool
	writing     chan struct{} // one token: the right to write

	// Held with the writing token: the chunk in flight, if any.
	sent    chan struct{} // closed when smux has taken the chunk in flight
	sendErr error         // what smux said of it, valid once sent is closed

	// Set when a Write was cut short by Close or failed: the stream then
	// ends without its end record.
	cut atomic.Bool
	// How far the end record got (endNone and on): finish moves it on,
	// Abort stops it before it starts.
	end atomic.Int32
	// Closed when CloseWrite's end record is out (or failed, or will not
	// go); nil before CloseWrite. Written with the token held.
	tail chan struct{}

	// Set once nobody reads the stream at the peer's any more (it closed
	// the stream for good: frame.go), to what writes fail with from then
	// on.
	gone atomic.Pointer[error]

	rmu  sync.Mutex // serializes readers: they share rec
	rec  records
	body recordWriter // WriteTo's writer, kept to save an allocation
	// Closed when the drainer is done; nil until the peer's records
	// ended. Written with rmu held.
	drained chan struct{}

	// dmu orders the drainer's start with the caller's read deadlines:
	// once the drainer reads from smux, they no longer reach smux (see
	// readDeadlineBelow).
	dmu      sync.Mutex
	draining bool

	rdl, wdl netconn.Deadline
}

// The states of a stream's end record (stream.end).
const (
	endNone    int32 = iota // not sent, and may be
	endSending              // being sent
	endSent                 // out: the peer's reader reaches io.EOF
	endNever                // never sent: the stream was aborted or cut
)

// chunkSize is the most Write hands smux at once: two of smux's default
// frames, so that a bulk writer wakes a goroutine per 64 KiB.
const chunkSize = 64 << 10

// chunks holds the send buffers, so an idle stream holds none.
var chunks = sync.Pool{New: func() any { return new([chunkSize]byte) }}

var (
	_ net.Conn            = (*stream)(nil)
	_ io.WriterTo         = (*stream)(nil)
	_ netconn.CloseWriter = (*stream)(nil)
	_ netconn.Aborter     = (*stream)(nil)
)

func newStream(st *smux.Stream) *stream {
	stats.streams.Add(1)
	return &stream{st: st, closing: make(chan struct{}), writing: make(chan struct{}, 1)}
}

// Read reads the payload of the peer's records; the end record is
// io.EOF, a FIN without it ErrAborted.
func (s *stream) Read(p []byte) (int, error) {
	if err := s.check("read", &s.rdl); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for s.rec.rem == 0 {
		if s.rec.ended {
			s.startDrain()
			return 0, io.EOF
		}
		n, err := s.readBelow(s.rec.headerRoom())
		s.rec.gotHeader(n)
		if err != nil {
			return 0, s.readErr(err)
		}
	}
	n, err := s.readBelow(p[:min(len(p), s.rec.rem)])
	s.rec.rem -= n
	return n, s.readErr(err)
}

// readBelow reads from the smux stream.
func (s *stream) readBelow(p []byte) (int, error) {
	n, err := s.st.Read(p)
	if n == 0 && err == io.EOF {
		// smux v1.5.58's Read (tryReadV2) finds the buffer empty, lets go
		// of its lock, then sees that the stream has ended: the peer's
		// last frame and its FIN may both arrive in between, and the
		// stream would end without that frame's bytes
		// (TestLastFrameRace). The session buffers a frame before it
		// handles the FIN that follows, so once the end is seen a second
		// look at the buffer finds every byte; with none left it is
		// io.EOF again, at once.
		n, err = s.st.Read(p)
	}
	return n, err
}

// readErr is what a reader reports of an error of the smux stream: its
// end, where a record was due or in the middle of one, means the peer
// did not send the end record: it aborted, and nobody reads there.
func (s *stream) readErr(err error) error {
	if err == io.EOF {
		s.peerGone(&errPeerReset)
		return s.opError("read", errNoEnd)
	}
	return s.mapErr("read", err)
}

// WriteTo lets io.Copy take the stream's buffers as they come, without
// a copy into a buffer of its own: the records' payloads go to w as
// slices of smux's buffers.
func (s *stream) WriteTo(w io.Writer) (int64, error) {
	if err := s.check("read", &s.rdl); err != nil {
		return 0, err
	}
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.rec.ended {
		return 0, nil
	}
	s.body = recordWriter{rec: &s.rec, w: w}
	defer func() { s.body = recordWriter{} }()
	// No second look as in readBelow: smux's WriteTo waits for the end
	// under the lock that guards the buffer, so it sees every frame
	// buffered before the FIN (TestLastFrameRace/WriteTo).
	_, err := s.st.WriteTo(&s.body)
	switch {
	case err == errEnded:
		s.startDrain()
		return s.body.n, nil
	case s.body.err != nil:
		return s.body.n, s.body.err
	case err == nil:
		s.peerGone(&errPeerReset)
		return s.body.n, s.opError("read", errNoEnd)
	}
	return s.body.n, s.mapErr("read", err)
}

// errEnded stops smux's WriteTo at the end record.
var errEnded = errors.New("end record")

// recordWriter takes what smux's WriteTo hands it and writes the records'
// payloads to w.
type recordWriter struct {
	rec *records
	w   io.Writer
	n   int64 // payload bytes written to w
	err error // w's error
}

func (rw *recordWriter) Write(b []byte) (int, error) {
	all := len(b)
	for len(b) > 0 {
		var payload []byte
		payload, b = rw.rec.scan(b)
		if rw.rec.ended {
			rw.rec.scan(b) // the close mark, if it came with the end
			return all, errEnded
		}
		if len(payload) == 0 {
			continue
		}
		n, err := rw.w.Write(payload)
		rw.n += int64(n)
		if err == nil && n < len(payload) {
			err = io.ErrShortWrite
		}
		if err != nil {
			rw.err = err
			return all, err
		}
	}
	return all, nil
}

func (s *stream) Write(p []byte) (int, error) {
	if err := s.check("write", &s.wdl); err != nil {
		return 0, err
	}
	if err := s.acquire(); err != nil {
		return 0, err
	}
	defer s.release()
	if s.writeClosed.Load() {
		return 0, s.opError("write", errWriteAfterCloseWrite)
	}
	if gone := s.gone.Load(); gone != nil {
		return 0, s.opError("write", *gone)
	}
	var n int
	for n < len(p) {
		// Copy the next chunk while smux still sends the one before.
		buf := chunks.Get().(*[chunkSize]byte)
		m := copy(buf[headerSize:], p[n:])
		putHeader(buf[:], m)
		if err := s.waitSent(); err != nil {
			chunks.Put(buf)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				// Cut short by Close, or the session failed: the stream
				// must not look complete to the peer.
				s.cut.Store(true)
			}
			return n, err
		}
		s.send(buf, headerSize+m)
		n += m
	}
	return n, nil
}

// acquire takes the writing token, waiting for the write before it within
// the write deadline.
func (s *stream) acquire() error {
	select {
	case s.writing <- struct{}{}:
		return nil
	case <-s.wdl.Done():
		return s.opError("write", os.ErrDeadlineExceeded)
	case <-s.closing:
		return s.opError("write", net.ErrClosed)
	}
}

func (s *stream) release() { <-s.writing }

// send hands smux the first n bytes of buf, in the background. The token
// is held.
func (s *stream) send(buf *[chunkSize]byte, n int) {
	sent := make(chan struct{})
	s.sent = sent
	go func() {
		_, err := s.st.Write(buf[:n])
		if err == nil {
			// On an error smux may not be done with the buffer yet.
			chunks.Put(buf)
		}
		s.sendErr = err
		close(sent)
	}()
}

// waitSent waits, within the write deadline, until smux has taken the
// chunk in flight, and reports its error, which stays, or that nobody
// reads at the peer's any more. The token is held.
func (s *stream) waitSent() error {
	if s.sent != nil {
		select {
		case <-s.sent:
			s.sent = nil
		case <-s.wdl.Done():
			return s.opError("write", os.ErrDeadlineExceeded)
		case <-s.closing:
			return s.opError("write", net.ErrClosed)
		}
	}
	if gone := s.gone.Load(); gone != nil {
		return s.opError("write", *gone)
	}
	if s.sendErr != nil {
		return s.mapErr("write", s.sendErr)
	}
	return nil
}

var errWriteAfterCloseWrite = errors.New("write after CloseWrite")

// check fails a call at once if the stream is closed or its deadline has
// passed, as package net does even when data is waiting.
func (s *stream) check(op string, dl *netconn.Deadline) error {
	if s.closed.Load() {
		return s.opError(op, net.ErrClosed)
	}
	if dl.Exceeded() {
		return s.opError(op, os.ErrDeadlineExceeded)
	}
	return nil
}

// mapErr turns smux's errors into the ones package net gives.
func (s *stream) mapErr(op string, err error) error {
	switch {
	case err == nil, err == io.EOF:
		return err
	case s.closed.Load():
		return s.opError(op, net.ErrClosed)
	case op != "read" && s.gone.Load() != nil:
		// smux's write deadline woke the write (peerGone).
		return s.opError(op, *s.gone.Load())
	case errors.Is(err, smux.ErrTimeout):
		return s.opError(op, os.ErrDeadlineExceeded)
	case op == "write" && s.writeClosed.Load():
		return s.opError(op, errWriteAfterCloseWrite)
	case errors.Is(err, io.ErrClosedPipe):
		return s.opError(op, ErrSessionClosed)
	}
	// An error of the connection under the session (see sessionConn).
	return s.opError(op, fmt.Errorf("%w: %w", ErrSessionClosed, err))
}

func (s *stream) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "mux", Source: s.st.LocalAddr(), Addr: s.st.RemoteAddr(), Err: err}
}

// CloseWrite half-closes: the peer reads to the end, then io.EOF. It
// does not wait for the chunk in flight: the end record follows it, as a
// socket's FIN follows its send buffer. smux's FIN waits for Close or
// Abort, so that the close mark can still go (frame.go).
func (s *stream) CloseWrite() error {
	if s.closed.Load() {
		return s.opError("close", net.ErrClosed)
	}
	select {
	case s.writing <- struct{}{}:
	case <-s.closing:
		return s.opError("close", net.ErrClosed)
	}
	defer s.release()
	if s.writeClosed.Swap(true) {
		return nil
	}
	if gone := s.gone.Load(); gone != nil {
		return s.opError("close", *gone)
	}
	if s.sent == nil && s.sendErr != nil {
		return s.mapErr("close", s.sendErr)
	}
	tail := make(chan struct{})
	s.tail = tail
	go func() {
		defer close(tail)
		if !s.finish(!s.cut.Load(), false) {
			// The stream must not look complete to the peer: a FIN
			// without the end record, which its Read takes for an
			// abort.
			s.st.CloseWrite()
		}
	}()
	return nil
}

// finish waits for the chunk in flight, then sends the end record if end
// is set, every chunk went out and Abort did not come first, and the
// close mark with it if mark is set. It reports whether the end record
// went out. Writes are over: sent and sendErr no longer change.
func (s *stream) finish(end, mark bool) bool {
	if s.sent != nil {
		<-s.sent
	}
	if !end || s.sendErr != nil || !s.end.CompareAndSwap(endNone, endSending) {
		s.end.CompareAndSwap(endNone, endNever)
		return false
	}
	b := endRecord
	if mark {
		b += closeMark
	}
	if _, err := s.st.Write([]byte(b)); err != nil {
		s.end.Store(endNever)
		return false
	}
	s.end.Store(endSent)
	return true
}

// Close closes the stream. Like a socket's close it does not discard what
// was written: the chunk in flight and the end record are still sent, in
// the background, for up to lingerTimeout, before the stream ends; the
// close mark follows them, and the peer's writes fail from then on. A
// Close that cuts a Write short sends no end record: the peer's Read
// fails with ErrAborted.
func (s *stream) Close() error {
	if s.closed.Swap(true) {
		return s.opError("close", net.ErrClosed)
	}
	stats.streamsEnded.Add(1)
	close(s.closing)
	// Writers give the token back at once once closing is closed; it is
	// never released again.
	s.writing <- struct{}{}
	return s.shut(false)
}

// Abort closes the stream without its end record, so the peer's Read
// fails with ErrAborted rather than reaching a clean end: relays call it
// (through netconn.Abort) when the other side of a stream failed. After
// CloseWrite, once its end record is out (or on its way), the peer reads
// io.EOF all the same, and the close mark after it fails the peer's
// writes, as a TCP reset does. The session and its other streams carry
// on.
func (s *stream) Abort() error {
	if s.closed.Swap(true) {
		return s.opError("close", net.ErrClosed)
	}
	stats.streamsEnded.Add(1)
	s.cut.Store(true)
	close(s.closing)
	s.writing <- struct{}{} // as in Close
	return s.shut(true)
}

// shut ends the stream below for Close or Abort, which hold the token for
// good. The peer learns that nobody reads the stream here any more: from
// a FIN alone if it has not had the end record (and never will), or else
// from the close mark after the end record. Unless abort is set, what was
// written and the end record go first.
func (s *stream) shut(abort bool) error {
	tail := s.tail
	switch {
	case s.gone.Load() != nil:
		// Nobody reads at the peer's: nothing is left to send, and it
		// needs no telling.
		s.end.CompareAndSwap(endNone, endNever)
		return s.closeBelow()
	case tail == nil && (abort || s.cut.Load() || s.writeClosed.Load()):
		// Aborted, cut, or a CloseWrite that failed: no end record.
		s.end.Store(endNever)
		return s.closeBelow()
	case tail == nil:
		s.wakeReaders()
		s.linger(func() { s.finish(true, true) })
		return nil
	case abort && s.end.CompareAndSwap(endNone, endNever):
		// CloseWrite's end record still waits for the chunk in flight:
		// now it will not go.
		return s.closeBelow()
	}
	// CloseWrite's end record is out, or on its way (or failed): the
	// close mark follows it.
	s.wakeReaders()
	s.linger(func() {
		<-tail
		if s.end.Load() == endSent {
			s.st.Write([]byte(closeMark))
		}
	})
	return nil
}

// linger runs last in the background, then closes the smux stream: at
// the latest after lingerTimeout, when closing it fails the writes still
// waiting for the peer's window.
func (s *stream) linger(last func()) {
	go func() {
		t := time.AfterFunc(lingerTimeout, func() { s.st.Close() })
		defer t.Stop()
		last()
		s.st.Close()
	}()
}

// wakeReaders wakes the readers blocked in smux now, while the stream
// lingers (netconn.InterruptRead); once the drainer reads there, none is.
func (s *stream) wakeReaders() { s.readDeadlineBelow(aLongTimeAgo) }

// aLongTimeAgo is a deadline already gone by.
var aLongTimeAgo = time.Unix(1, 0)

// closeBelow closes the smux stream now: the peer sees its FIN, and the
// end record only if it was sent before.
func (s *stream) closeBelow() error {
	err := s.st.Close()
	if errors.Is(err, io.ErrClosedPipe) {
		// The session is gone, or the stream was already half-closed
		// both ways: either way it is closed now.
		return nil
	}
	return err
}

// lingerTimeout bounds how long a closed stream still tries to send its
// last chunk, its end record and its close mark to a peer that does not
// read.
const lingerTimeout = 30 * time.Second

// startDrain starts the drainer (see stream), once, when the peer's
// records have ended. rmu is held.
func (s *stream) startDrain() {
	if s.drained != nil {
		return
	}
	s.drained = make(chan struct{})
	s.dmu.Lock()
	s.draining = true
	s.st.SetReadDeadline(time.Time{})
	s.dmu.Unlock()
	go s.drain(s.rec.marked)
}

// drain reads from smux what comes after the peer's end record, keeping
// none of it, until the stream's end there. Any byte is the close mark
// (marked: it came already, with the end record).
func (s *stream) drain(marked bool) {
	defer close(s.drained)
	if marked {
		s.peerGone(&errPeerClosed)
	}
	var buf [512]byte
	for {
		n, err := s.readBelow(buf[:])
		if n == 0 && err != nil && err != io.EOF {
			// smux's Read waits for a frame or the session's end,
			// whichever it sees first: when both came, a second look
			// takes the frame (readBelow's does it for io.EOF).
			n, _ = s.st.Read(buf[:])
		}
		if n > 0 && !marked {
			marked = true
			s.peerGone(&errPeerClosed)
		}
		if err != nil {
			// The peer's FIN (without the mark, from a peer that sends
			// none), the stream closed here, or the session's end.
			return
		}
	}
}

// peerGone records that nobody reads the stream at the peer's any more:
// writes fail with *err from then on, and a smux Write waiting for the
// peer's window is woken (see stream).
func (s *stream) peerGone(err *error) {
	if s.gone.CompareAndSwap(nil, err) {
		s.st.SetWriteDeadline(aLongTimeAgo)
	}
}

func (s *stream) LocalAddr() net.Addr  { return s.st.LocalAddr() }
func (s *stream) RemoteAddr() net.Addr { return s.st.RemoteAddr() }

// SetDeadline sets both deadlines; they apply to calls already blocked.
// smux sees only the read deadline (see stream).
func (s *stream) SetDeadline(t time.Time) error {
	s.rdl.Set(t)
	s.wdl.Set(t)
	return s.setErr(s.readDeadlineBelow(t))
}

func (s *stream) SetReadDeadline(t time.Time) error {
	s.rdl.Set(t)
	return s.setErr(s.readDeadlineBelow(t))
}

// readDeadlineBelow sets smux's read deadline, for the reads the caller's
// Read and WriteTo make there, unless the drainer reads there now: the
// caller's reads then end at the end record without reading smux, and the
// drainer is bound by no deadline.
func (s *stream) readDeadlineBelow(t time.Time) error {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if s.draining {
		return nil
	}
	return s.st.SetReadDeadline(t)
}

func (s *stream) SetWriteDeadline(t time.Time) error {
	s.wdl.Set(t)
	return s.setErr(nil)
}

func (s *stream) setErr(err error) error {
	if s.closed.Load() {
		return s.opError("set", net.ErrClosed)
	}
	return err
}

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
	// Closed when CloseWrite's end record and FIN are out (or failed);
	// nil before CloseWrite. Written with the token held.
	tail chan struct{}

	rmu  sync.Mutex // serializes readers: they share rec
	rec  records
	body recordWriter // WriteTo's writer, kept to save an allocation

	rdl, wdl netconn.Deadline
}

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
// did not send the end record.
func (s *stream) readErr(err error) error {
	if err == io.EOF {
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
		return s.body.n, nil
	case s.body.err != nil:
		return s.body.n, s.body.err
	case err == nil:
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
// chunk in flight, and reports its error, which stays. The token is held.
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
// does not wait for the chunk in flight: the end record and the FIN
// follow it, as a socket's FIN follows its send buffer.
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
	if s.sent == nil && s.sendErr != nil {
		return s.mapErr("close", s.sendErr)
	}
	tail := make(chan struct{})
	s.tail = tail
	go func() {
		defer close(tail)
		s.finish(!s.cut.Load())
		s.st.CloseWrite()
	}()
	return nil
}

// finish waits for the chunk in flight, then sends the end record if end
// is set and every chunk went out. Writes are over: sent and sendErr no
// longer change.
func (s *stream) finish(end bool) {
	if s.sent != nil {
		<-s.sent
	}
	if end && s.sendErr == nil {
		s.st.Write([]byte(endRecord))
	}
}

// Close closes the stream. Like a socket's close it does not discard what
// was written: the chunk in flight and the end record are still sent, in
// the background, for up to lingerTimeout, before the stream ends. A
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
	tail, end := s.tail, !s.writeClosed.Swap(true) && !s.cut.Load()
	if tail == nil && !end {
		return s.closeBelow()
	}
	netconn.InterruptRead(s.st) // wake blocked readers now
	go func() {
		// Past lingerTimeout, closing the stream fails the writes still
		// waiting for the peer's window.
		t := time.AfterFunc(lingerTimeout, func() { s.st.Close() })
		defer t.Stop()
		if tail != nil {
			<-tail
		} else {
			s.finish(true)
		}
		s.st.Close()
	}()
	return nil
}

// Abort closes the stream without its end record, so the peer's Read
// fails with ErrAborted rather than reaching a clean end: relays call it
// (through netconn.Abort) when the other side of a stream failed. The
// session and its other streams carry on.
func (s *stream) Abort() error {
	if s.closed.Swap(true) {
		return s.opError("close", net.ErrClosed)
	}
	stats.streamsEnded.Add(1)
	s.cut.Store(true)
	close(s.closing)
	return s.closeBelow()
}

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
// last chunk and its end record to a peer that does not read.
const lingerTimeout = 30 * time.Second

func (s *stream) LocalAddr() net.Addr  { return s.st.LocalAddr() }
func (s *stream) RemoteAddr() net.Addr { return s.st.RemoteAddr() }

// SetDeadline sets both deadlines; they apply to calls already blocked.
// smux sees only the read deadline (see stream).
func (s *stream) SetDeadline(t time.Time) error {
	s.rdl.Set(t)
	s.wdl.Set(t)
	return s.setErr(s.st.SetReadDeadline(t))
}

func (s *stream) SetReadDeadline(t time.Time) error {
	s.rdl.Set(t)
	return s.setErr(s.st.SetReadDeadline(t))
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

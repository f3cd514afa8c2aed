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
type stream struct {
	st *smux.Stream

	closed      atomic.Bool
	closing     chan struct{} // closed by Close, for writers waiting their turn
	writeClosed atomic.Bool
	writing     chan struct{} // one token: the right to write

	// Held with the writing token: the chunk in flight, if any.
	sent    chan struct{} // closed when smux has taken the chunk in flight
	sendErr error         // what smux said of it, valid once sent is closed

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
)

func newStream(st *smux.Stream) *stream {
	return &stream{st: st, closing: make(chan struct{}), writing: make(chan struct{}, 1)}
}

func (s *stream) Read(p []byte) (int, error) {
	if err := s.check("read", &s.rdl); err != nil {
		return 0, err
	}
	n, err := s.st.Read(p)
	if n == 0 && err == io.EOF {
		// smux v1.5.58 finds the buffer empty, then, without its lock,
		// that the stream has ended: the peer's last frame and its FIN
		// may both arrive in between, and the stream would end without
		// that frame's bytes. The session buffers a frame before it
		// handles the FIN that follows, so once the end is seen a second
		// look at the buffer finds every byte; with none left it is
		// io.EOF again, at once.
		n, err = s.st.Read(p)
	}
	return n, s.mapErr("read", err)
}

// WriteTo lets io.Copy take the stream's buffers as they come, without
// a copy into a buffer of its own.
func (s *stream) WriteTo(w io.Writer) (int64, error) {
	if err := s.check("read", &s.rdl); err != nil {
		return 0, err
	}
	n, err := s.st.WriteTo(w)
	return n, s.mapErr("read", err)
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
		m := copy(buf[:], p[n:])
		if err := s.waitSent(); err != nil {
			chunks.Put(buf)
			return n, err
		}
		s.send(buf, m)
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

// CloseWrite half-closes: the peer reads to the end, then io.EOF. It does
// not wait for the chunk in flight: the FIN follows it.
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
	if sent := s.sent; sent != nil {
		// Writes are over: sent and sendErr no longer change.
		go func() {
			<-sent
			if s.sendErr == nil {
				s.st.CloseWrite()
			}
		}()
		return nil
	}
	if s.sendErr != nil {
		return s.mapErr("close", s.sendErr)
	}
	return s.mapErr("close", s.st.CloseWrite())
}

// Close closes the stream. Like a socket's close it does not discard what
// was written: the chunk in flight is still sent, in the background, for
// up to lingerTimeout, before the stream ends.
func (s *stream) Close() error {
	if s.closed.Swap(true) {
		return s.opError("close", net.ErrClosed)
	}
	close(s.closing)
	// Writers give the token back at once once closing is closed; it is
	// never released again.
	s.writing <- struct{}{}
	if sent := s.sent; sent != nil {
		netconn.InterruptRead(s.st) // wake blocked readers now
		go func() {
			t := time.NewTimer(lingerTimeout)
			defer t.Stop()
			select {
			case <-sent:
			case <-t.C:
			}
			s.st.Close()
		}()
		return nil
	}
	err := s.st.Close()
	if errors.Is(err, io.ErrClosedPipe) {
		// The session is gone, or the stream was already half-closed
		// both ways: either way it is closed now.
		return nil
	}
	return err
}

// lingerTimeout bounds how long a closed stream still tries to send its
// last chunk to a peer that does not read.
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

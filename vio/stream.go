package vio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// A MessageConn is a packet transport with the reliability a stream
// needs: it carries messages whole, in order, without loss or
// duplication, each up to MaxMessage bytes. A SOCK_SEQPACKET socket is
// one (NewSeqPacket); a high-speed network's send and receive queues,
// or a reliable-datagram layer over UDP, are others.
type MessageConn interface {
	// ReadMessage reads the next message into p, which holds
	// MaxMessage bytes, and returns its length; io.EOF once the peer
	// has closed and every message was read.
	ReadMessage(p []byte) (int, error)
	// WriteMessage sends p, at most MaxMessage bytes, as one message.
	WriteMessage(p []byte) error
	// MaxMessage is the largest message, at least 2 bytes.
	MaxMessage() int
	// Deadlines, addresses and Close as a net.Conn's.
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	LocalAddr() net.Addr
	RemoteAddr() net.Addr
	Close() error
}

// Stream makes a byte stream of m with the whole net.Conn contract:
// reads of any size, writes cut into messages, deadlines, CloseWrite
// (the peer reads io.EOF after the last byte), and an end that cannot be
// mistaken: each message starts with a kind byte,
//
//	data = 'd' | bytes     fin = 'f'     rst = 'r'
//
// so the peer tells the end of the stream (fin) from an abort (rst,
// Abort) and from a transport that ended with neither (the process
// died), which Read reports as ErrReset, never as io.EOF. Any other
// message is a protocol error (ErrMessage) that ends the stream.
func Stream(m MessageConn) net.Conn {
	max := m.MaxMessage()
	return &stream{m: m, rbuf: make([]byte, max), wbuf: make([]byte, max)}
}

// Message kinds: the first byte of every message of a Stream.
const (
	kindData = 'd'
	kindFin  = 'f'
	kindRst  = 'r'
)

var (
	// ErrReset: the peer aborted the stream, or its transport ended
	// without the end of the stream: what was read is not all of it.
	ErrReset = errors.New("vio: stream reset by peer")
	// ErrMessage: the peer sent a message that is not the stream's.
	ErrMessage = errors.New("vio: malformed stream message")
)

type stream struct {
	m MessageConn

	rmu   sync.Mutex
	rbuf  []byte
	rest  []byte // data of the last message not yet read
	rerr  error  // sticky: io.EOF, or why the stream failed
	wmu   sync.Mutex
	wbuf  []byte
	wdone bool // fin or rst sent

	closeOnce sync.Once
}

var _ net.Conn = (*stream)(nil)

func (s *stream) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "vio", Source: s.m.LocalAddr(), Addr: s.m.RemoteAddr(), Err: err}
}

func (s *stream) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for len(s.rest) == 0 {
		if s.rerr != nil {
			return 0, s.opErr("read", s.rerr)
		}
		if len(p) == 0 {
			return 0, nil
		}
		n, err := s.m.ReadMessage(s.rbuf)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
			return 0, s.opErr("read", err) // not sticky: a later read may succeed
		case err == io.EOF:
			s.rerr = ErrReset // the transport ended without the stream's end
		case err != nil:
			s.rerr = err
		case n == 0:
			s.rerr = fmt.Errorf("%w: an empty message", ErrMessage)
		default:
			s.rerr = s.take(s.rbuf[:n])
		}
	}
	n := copy(p, s.rest)
	s.rest = s.rest[n:]
	return n, nil
}

// take takes in one message; a non-nil result ends the reading side.
func (s *stream) take(msg []byte) error {
	switch msg[0] {
	case kindData:
		if len(msg) == 1 {
			return fmt.Errorf("%w: a data message without data", ErrMessage)
		}
		s.rest = msg[1:]
		return nil
	case kindFin:
		if len(msg) != 1 {
			return fmt.Errorf("%w: an end of stream with %d bytes", ErrMessage, len(msg)-1)
		}
		return io.EOF
	case kindRst:
		return ErrReset
	}
	return fmt.Errorf("%w: kind %#x", ErrMessage, msg[0])
}

func (s *stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wdone {
		return 0, s.opErr("write", syscall.EPIPE)
	}
	written := 0
	for len(p) > 0 {
		n := copy(s.wbuf[1:], p)
		s.wbuf[0] = kindData
		if err := s.m.WriteMessage(s.wbuf[:1+n]); err != nil {
			return written, s.opErr("write", err)
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// end sends the end of what this side writes, fin or rst, once.
func (s *stream) end(kind byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wdone {
		return nil
	}
	s.wdone = true
	return s.m.WriteMessage([]byte{kind})
}

// CloseWrite ends the stream this side sends: the peer reads what was
// written, then io.EOF.
func (s *stream) CloseWrite() error {
	if err := s.end(kindFin); err != nil {
		return s.opErr("close", err)
	}
	return nil
}

// Close ends the stream as CloseWrite does, then closes the transport.
func (s *stream) Close() error { return s.close(kindFin) }

// Abort ends the stream so that the peer reads ErrReset, not its end
// (netconn.Abort).
func (s *stream) Abort() error { return s.close(kindRst) }

func (s *stream) close(kind byte) error {
	err := net.ErrClosed
	s.closeOnce.Do(func() {
		// The end is sent with a bound: a peer that reads nothing must
		// not hold Close.
		s.m.SetWriteDeadline(time.Now().Add(time.Second))
		s.end(kind)
		err = s.m.Close()
	})
	if err != nil {
		return s.opErr("close", err)
	}
	return nil
}

func (s *stream) LocalAddr() net.Addr  { return s.m.LocalAddr() }
func (s *stream) RemoteAddr() net.Addr { return s.m.RemoteAddr() }

func (s *stream) SetDeadline(t time.Time) error {
	if err := s.m.SetReadDeadline(t); err != nil {
		return err
	}
	return s.m.SetWriteDeadline(t)
}

func (s *stream) SetReadDeadline(t time.Time) error  { return s.m.SetReadDeadline(t) }
func (s *stream) SetWriteDeadline(t time.Time) error { return s.m.SetWriteDeadline(t) }

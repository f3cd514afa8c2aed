package vio

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/framed"
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
//
// Its ends are those of every framed layer (netconn/framed): Close sends
// fin in the background, for up to framed.CloseLinger, unless a Write is
// in progress, which it cuts (no fin: the peer reads ErrReset); Abort
// sends rst.
func Stream(m MessageConn) net.Conn {
	max := m.MaxMessage()
	s := &stream{m: m, rbuf: make([]byte, max), wbuf: make([]byte, max)}
	// Only MessageConn's methods: what else m's type has (a seqpacket
	// socket's Read and CloseWrite) is not the stream's.
	s.ends.Init(struct{ MessageConn }{m}, "vio", streamFraming{s})
	return s
}

// Message kinds: the first byte of every message of a Stream.
const (
	kindData = 'd'
	kindFin  = 'f'
	kindRst  = 'r'
)

var (
	// ErrReset: the peer aborted the stream, or its transport ended
	// without the end of the stream: what was read is not all of it. It
	// matches framed.ErrReset (and syscall.ECONNRESET), as the other
	// framed layers' resets do.
	ErrReset = fmt.Errorf("vio: %w", framed.ErrReset)
	// ErrMessage: the peer sent a message that is not the stream's.
	ErrMessage = errors.New("vio: malformed stream message")
)

type stream struct {
	m    MessageConn
	ends framed.Ends

	// The read side, under ends.LockRead.
	rbuf []byte
	rest []byte // data of the last message not yet read
	rerr error  // sticky: io.EOF, or why the stream failed

	// The write side, under ends.LockWrite.
	wbuf []byte
}

var (
	_ net.Conn        = (*stream)(nil)
	_ netconn.Aborter = (*stream)(nil)
)

func (s *stream) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return s.ends.OpError(op, err)
}

func (s *stream) Read(p []byte) (int, error) {
	s.ends.LockRead()
	defer s.ends.UnlockRead()
	if err := s.ends.ReadClosed(); err != nil {
		return 0, err
	}
	for len(s.rest) == 0 {
		if s.rerr != nil {
			return 0, s.opErr("read", s.rerr)
		}
		if len(p) == 0 {
			return 0, nil
		}
		n, err := s.m.ReadMessage(s.rbuf)
		switch {
		case err != nil && s.ends.Closed():
			return 0, s.ends.ReadClosed()
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
		s.ends.PeerEnded()
		return io.EOF
	case kindRst:
		return ErrReset
	}
	return fmt.Errorf("%w: kind %#x", ErrMessage, msg[0])
}

// Write sends p as data messages. Messages go whole or not at all, so a
// deadline leaves no part of one to send later.
func (s *stream) Write(p []byte) (int, error) {
	s.ends.LockWrite()
	defer s.ends.UnlockWrite()
	if err := s.ends.Writable(); err != nil {
		return 0, err
	}
	written := 0
	for len(p) > 0 {
		n := copy(s.wbuf[1:], p)
		s.wbuf[0] = kindData
		if err := s.m.WriteMessage(s.wbuf[:1+n]); err != nil {
			return written, s.ends.WriteErr(s.opErr("write", err))
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// CloseWrite ends the stream this side sends: the peer reads what was
// written, then io.EOF.
func (s *stream) CloseWrite() error { return s.ends.CloseWrite() }

// Close ends the stream as CloseWrite does, then closes the transport;
// a Close during a Write cuts the stream instead (framed.Ends.Close).
func (s *stream) Close() error { return s.ends.Close() }

// Abort ends the stream so that the peer reads ErrReset, not its end
// (netconn.Abort).
func (s *stream) Abort() error { return s.ends.Abort() }

// streamFraming is the stream's part of its ends: fin and rst. A message
// goes whole or not at all: there is never a tail, and the read buffer
// is the stream's for its life.
type streamFraming struct{ s *stream }

func (f streamFraming) WriteEnd() (bool, error) { return f.marker(kindFin) }
func (f streamFraming) WriteAbort() error       { _, err := f.marker(kindRst); return err }
func (f streamFraming) FlushTail() error        { return nil }
func (f streamFraming) DropTail()               {}
func (f streamFraming) ReleaseRead()            { f.s.rest = nil }

func (f streamFraming) marker(kind byte) (bool, error) {
	f.s.wbuf[0] = kind
	if err := f.s.m.WriteMessage(f.s.wbuf[:1]); err != nil {
		return false, f.s.ends.WriteErr(f.s.opErr("close", err))
	}
	return true, nil
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

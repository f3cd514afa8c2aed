package framed_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/framed"
)

// toy is the smallest framed layer, written against Ends as a layer
// author would: data frames ('d', a 16-bit length, the bytes), the end
// marker 'e' and, when made with an abort marker, 'a'. Unlike a real
// layer it keeps no state across a read deadline inside a frame.
type toy struct {
	c    net.Conn
	ends framed.Ends

	// The read side, under ends.LockRead.
	br   *bufio.Reader // over c: a frame's header, then its bytes, in few reads
	left int           // bytes of the current data frame not yet read
	rerr error         // sticky: io.EOF or a failure of the stream

	// The write side, under ends.LockWrite.
	tail []byte // the rest of a frame a deadline cut

	released atomic.Int32 // ReleaseRead calls, for the tests
}

const maxFrame = 16 << 10

var (
	_ net.Conn        = (*toy)(nil)
	_ netconn.Aborter = (*toy)(nil)
)

func newToy(c net.Conn, abortMarker bool) *toy {
	t := &toy{c: c, br: bufio.NewReaderSize(c, 256<<10)}
	var f framed.Framing = toyFraming{t}
	if abortMarker {
		f = toyAbortFraming{toyFraming{t}}
	}
	t.ends.Init(c, "toy", f)
	return t
}

type toyFraming struct{ t *toy }

func (f toyFraming) WriteEnd() (bool, error) { return f.t.send([]byte{'e'}) }
func (f toyFraming) FlushTail() error        { return f.t.flushTail() }
func (f toyFraming) DropTail()               { f.t.tail = nil }
func (f toyFraming) ReleaseRead()            { f.t.released.Add(1) }

type toyAbortFraming struct{ toyFraming }

func (f toyAbortFraming) WriteAbort() error {
	_, err := f.t.send([]byte{'a'})
	return err
}

func (t *toy) Write(p []byte) (int, error) {
	t.ends.LockWrite()
	defer t.ends.UnlockWrite()
	if err := t.ends.Writable(); err != nil {
		return 0, err
	}
	if err := t.flushTail(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		chunk := p[n:min(len(p), n+maxFrame)]
		frame := append([]byte{'d', byte(len(chunk) >> 8), byte(len(chunk))}, chunk...)
		sent, err := t.send(frame)
		if sent {
			n += len(chunk)
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// send writes a frame; one a deadline cut counts as sent, its rest kept
// in the tail.
func (t *toy) send(frame []byte) (bool, error) {
	k, err := t.c.Write(frame)
	if err == nil {
		return true, nil
	}
	if k > 0 && errors.Is(err, os.ErrDeadlineExceeded) && !t.ends.Closed() {
		t.tail = frame[k:]
		return true, err
	}
	return false, t.ends.WriteErr(err)
}

func (t *toy) flushTail() error {
	if len(t.tail) == 0 {
		return nil
	}
	k, err := t.c.Write(t.tail)
	t.tail = t.tail[k:]
	if err != nil {
		return t.ends.WriteErr(err)
	}
	return nil
}

func (t *toy) Read(p []byte) (int, error) {
	t.ends.LockRead()
	defer t.ends.UnlockRead()
	if err := t.ends.ReadClosed(); err != nil {
		return 0, err
	}
	for t.left == 0 {
		if t.rerr != nil {
			return 0, t.rerr
		}
		if len(p) == 0 {
			return 0, nil
		}
		var h [3]byte
		if _, err := io.ReadFull(t.br, h[:1]); err != nil {
			return 0, t.readErr(err)
		}
		switch h[0] {
		case 'e':
			t.rerr = io.EOF
			t.ends.PeerEnded()
		case 'a':
			t.rerr = t.ends.OpError("read", framed.ErrReset)
		case 'd':
			if _, err := io.ReadFull(t.br, h[1:]); err != nil {
				return 0, t.readErr(err)
			}
			t.left = int(h[1])<<8 | int(h[2])
		default:
			t.rerr = t.ends.OpError("read", errors.New("toy: not a frame"))
		}
	}
	n, err := t.br.Read(p[:min(len(p), t.left)])
	t.left -= n
	if err != nil && n == 0 {
		return 0, t.readErr(err)
	}
	return n, nil
}

func (t *toy) readErr(err error) error {
	if cerr := t.ends.ReadClosed(); cerr != nil {
		return cerr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.rerr = t.ends.OpError("read", framed.ErrNoEnd)
		return t.rerr
	}
	return err
}

func (t *toy) Close() error      { return t.ends.Close() }
func (t *toy) CloseWrite() error { return t.ends.CloseWrite() }
func (t *toy) Abort() error      { return t.ends.Abort() }

func (t *toy) LocalAddr() net.Addr                { return t.c.LocalAddr() }
func (t *toy) RemoteAddr() net.Addr               { return t.c.RemoteAddr() }
func (t *toy) SetDeadline(d time.Time) error      { return t.ends.SetDeadline(d) }
func (t *toy) SetReadDeadline(d time.Time) error  { return t.ends.SetReadDeadline(d) }
func (t *toy) SetWriteDeadline(d time.Time) error { return t.c.SetWriteDeadline(d) }

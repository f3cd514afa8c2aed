package testnet

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// FakeConn is a net.Conn over an io.Reader and an io.Writer, for feeding
// a layer hand-made streams and recording what it writes: reads from a
// nil R are io.EOF, writes to a nil W are dropped. Deadlines are ignored
// and Close does nothing.
type FakeConn struct {
	R io.Reader
	W io.Writer
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fake" }
func (fakeAddr) String() string  { return "fake" }

func (f *FakeConn) Read(p []byte) (int, error) {
	if f.R == nil {
		return 0, io.EOF
	}
	return f.R.Read(p)
}

func (f *FakeConn) Write(p []byte) (int, error) {
	if f.W == nil {
		return len(p), nil
	}
	return f.W.Write(p)
}

func (f *FakeConn) Close() error                     { return nil }
func (f *FakeConn) LocalAddr() net.Addr              { return fakeAddr{} }
func (f *FakeConn) RemoteAddr() net.Addr             { return fakeAddr{} }
func (f *FakeConn) SetDeadline(time.Time) error      { return nil }
func (f *FakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *FakeConn) SetWriteDeadline(time.Time) error { return nil }

// EOFSignal reads R and closes Done once a read returns io.EOF. Once a
// framed layer has read its peer's end marker, its tail reader reads the
// connection below to its end (netconn/framed's Ends.PeerEnded): a test
// that reads the same bytes again through the same layer waits for Done
// first.
type EOFSignal struct {
	R    io.Reader
	Done chan struct{}
	once sync.Once
}

// NewEOFSignal returns an EOFSignal reading r.
func NewEOFSignal(r io.Reader) *EOFSignal {
	return &EOFSignal{R: r, Done: make(chan struct{})}
}

// Wait waits for Done, failing tb after 10 s.
func (s *EOFSignal) Wait(tb testing.TB) {
	tb.Helper()
	select {
	case <-s.Done:
	case <-time.After(10 * time.Second):
		tb.Fatal("nothing read the connection below to its end after 10s")
	}
}

func (s *EOFSignal) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	if err == io.EOF {
		s.once.Do(func() { close(s.Done) })
	}
	return n, err
}

// DribbleConn hands out Data a Step of bytes at a time and fails every
// other Read with a deadline error, as a real connection does when a read
// deadline fires in the middle of a frame.
type DribbleConn struct {
	FakeConn
	Data  []byte
	Step  int
	calls int
}

func (d *DribbleConn) Read(p []byte) (int, error) {
	d.calls++
	if d.calls%2 == 0 {
		return 0, &net.OpError{Op: "read", Net: "fake", Err: os.ErrDeadlineExceeded}
	}
	if len(d.Data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), d.Step)], d.Data)
	d.Data = d.Data[n:]
	return n, nil
}

// CutConn records writes in Wire, and cuts the write that crosses byte
// CutAt short with a deadline error, once, as a write deadline firing in
// the middle of a frame does.
type CutConn struct {
	FakeConn
	Wire  bytes.Buffer
	CutAt int
}

func (c *CutConn) Write(p []byte) (int, error) {
	if c.CutAt >= 0 && c.Wire.Len()+len(p) > c.CutAt {
		n := c.CutAt - c.Wire.Len()
		c.Wire.Write(p[:n])
		c.CutAt = -1
		return n, &net.OpError{Op: "write", Net: "fake", Err: os.ErrDeadlineExceeded}
	}
	return c.Wire.Write(p)
}

// TrailerConn stands for a layer below a framed layer that has an end of
// its own (noise's end record under compression, compression's end
// frame under noise): its CloseWrite sends a few more bytes, a moment
// after the end marker above, before the TCP end.
type TrailerConn struct{ *net.TCPConn }

func (c TrailerConn) CloseWrite() error {
	time.Sleep(20 * time.Millisecond)
	if _, err := c.TCPConn.Write([]byte("end of the layer below")); err != nil {
		return err
	}
	return c.TCPConn.CloseWrite()
}

package noise

import (
	"bytes"
	"io"
	"net"
	"os"
	"testing"
	"time"

	flynn "github.com/flynn/noise"
	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	testKey        = []byte("0123456789abcdef-test-key")
	testTranscript = []byte("\x89VLK\r\n\x1a\n hello, challenge, auth, accept")
)

// pair runs the handshake between a and b and returns the two ends.
func pair(tb testing.TB, a, b net.Conn) (client, server net.Conn) {
	tb.Helper()
	hs := layer.Handshake{Key: testKey, Transcript: testTranscript}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := Filter{}.ServerHandshake(b, hs)
		ch <- res{c, err}
	}()
	client, err := Filter{}.ClientHandshake(a, hs)
	r := <-ch
	if err != nil || r.err != nil {
		tb.Fatalf("handshake: client %v, server %v", err, r.err)
	}
	return client, r.c
}

// states returns the two ends of one direction, as a handshake leaves
// them, under a fixed key, for hand-made streams.
func states() (send, recv *cipherState) {
	k := [32]byte{1, 2, 3}
	s, _ := newCipherState(flynn.UnsafeNewCipherState(suite, k, 0))
	r, _ := newCipherState(flynn.UnsafeNewCipherState(suite, k, 0))
	return s, r
}

// encode returns the wire form of the given writes, followed by the end
// record if end is set, and a reader's cipher state for it.
func encode(tb testing.TB, end bool, writes ...[]byte) (wire []byte, recv *cipherState) {
	tb.Helper()
	var buf bytes.Buffer
	send, recv := states()
	c := newConn(&fakeConn{w: &buf}, send, nil)
	for _, w := range writes {
		if _, err := c.Write(w); err != nil {
			tb.Fatal(err)
		}
	}
	if end {
		if err := c.CloseWrite(); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes(), recv
}

// records splits a wire stream into its records.
func records(wire []byte) [][]byte {
	var out [][]byte
	for len(wire) >= headerSize {
		n := headerSize + (*header)(wire).Len()
		out = append(out, wire[:n])
		wire = wire[n:]
	}
	return out
}

// fakeConn is a net.Conn over an io.Reader and an io.Writer, for feeding
// a conn hand-made streams and recording what it writes.
type fakeConn struct {
	r io.Reader
	w io.Writer
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fake" }
func (fakeAddr) String() string  { return "fake" }

func (f *fakeConn) Read(p []byte) (int, error) {
	if f.r == nil {
		return 0, io.EOF
	}
	return f.r.Read(p)
}

func (f *fakeConn) Write(p []byte) (int, error) {
	if f.w == nil {
		return len(p), nil
	}
	return f.w.Write(p)
}
func (f *fakeConn) Close() error                     { return nil }
func (f *fakeConn) LocalAddr() net.Addr              { return fakeAddr{} }
func (f *fakeConn) RemoteAddr() net.Addr             { return fakeAddr{} }
func (f *fakeConn) SetDeadline(time.Time) error      { return nil }
func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// timeoutErr is what a fake connection returns when its deadline fires.
var timeoutErr = &net.OpError{Op: "write", Net: "fake", Err: os.ErrDeadlineExceeded}

// dribbleConn hands out a stream a few bytes at a time and fails every
// other Read with a deadline error, as a real connection would when a
// read deadline fires in the middle of a record.
type dribbleConn struct {
	fakeConn
	data  []byte
	step  int
	calls int
}

func (d *dribbleConn) Read(p []byte) (int, error) {
	d.calls++
	if d.calls%2 == 0 {
		return 0, &net.OpError{Op: "read", Net: "fake", Err: os.ErrDeadlineExceeded}
	}
	if len(d.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), d.step)], d.data)
	d.data = d.data[n:]
	return n, nil
}

// cutConn records writes, and cuts the write that crosses byte cutAt short
// with a deadline error.
type cutConn struct {
	fakeConn
	wire  bytes.Buffer
	cutAt int
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.cutAt >= 0 && c.wire.Len()+len(p) > c.cutAt {
		n := c.cutAt - c.wire.Len()
		c.wire.Write(p[:n])
		c.cutAt = -1
		return n, timeoutErr
	}
	return c.wire.Write(p)
}

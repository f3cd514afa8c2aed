package layertest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// endWait bounds how long an end waits to learn that its peer aborted or
// its stream was cut: the news crosses one connection, so a few
// round trips at most, unless nothing tells it at all.
const endWait = 10 * time.Second

// testAbort aborts one end (netconn.Abort) and checks what the other
// reads: bytes that were sent, then an error that is not io.EOF. In
// flight, the aborting end is writing when it aborts and its peer has
// read part of the stream; idle, nothing moves. Its peer sends nothing:
// bytes left unread at the aborting end would make its kernel reset the
// connection whatever the layer did, and hide a layer that closes
// (sending its end marker) where it should abort.
func testAbort(t *testing.T, mp MakePipe, opts Options, from end, inFlight bool) {
	p := pipe(t, mp)
	a, b := p.ends(from)
	want := newData(7) // what b may read: the prefix of this stream
	writeDone := make(chan error, 1)
	if inFlight {
		go func() {
			_, err := io.Copy(a, newData(7))
			writeDone <- err
		}()
		b.SetReadDeadline(time.Now().Add(endWait))
		if _, err := readSent(b, want, 64<<10); err != nil {
			t.Fatalf("%v before the abort: %v", from.peer(), err)
		}
	}
	if err := netconn.Abort(a); err != nil {
		t.Logf("Abort: %v", err) // the peer's view is what counts
	}
	b.SetReadDeadline(time.Now().Add(endWait))
	n, err := readSent(b, want, -1)
	var skip string
	switch {
	case errors.Is(err, errNotSent):
		t.Errorf("after the %v aborted, the %v read %d bytes, then: %v", from, from.peer(), n, err)
	case (err == io.EOF || errors.Is(err, io.EOF)) && opts.LosesAborts:
		skip = fmt.Sprintf("after the %v aborted, the %v read %d bytes, then %v, as the pipes' path declares (Options.LosesAborts): the abort was not checked", from, from.peer(), n, describe(err))
	case err == io.EOF || errors.Is(err, io.EOF):
		t.Errorf("after the %v aborted, the %v read %d bytes, then %v: an abort must read as an error, never as a clean end", from, from.peer(), n, describe(err))
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Errorf("after the %v aborted, the %v read %d bytes, then nothing for %v: it was not told", from, from.peer(), n, endWait)
	case errors.Is(err, net.ErrClosed):
		t.Errorf("after the %v aborted, the %v read %v, which says it was closed itself", from, from.peer(), err)
	case !isOpError(err):
		t.Errorf("after the %v aborted, the %v read %d bytes, then %v (%T): want a *net.OpError naming the layer", from, from.peer(), n, err, err)
	default:
		t.Logf("the %v read %d bytes, then %v", from.peer(), n, err)
	}
	if inFlight {
		select {
		case <-writeDone:
		case <-time.After(endWait):
			t.Errorf("a Write of the %v was still blocked %v after its Abort", from, endWait)
		}
	}
	if skip != "" {
		t.Skip(skip)
	}
}

// testTruncation cuts the stream below the layer (Pipe.Cut) after the
// reader has read all that was written, so the layer's writer is between
// two writes with its stream not ended, and checks what the reader gets:
// an error for a layer with end markers, io.EOF (and a skip that says
// so) for one without.
func testTruncation(t *testing.T, mp MakePipe, opts Options, from end) {
	p := pipe(t, mp)
	if p.Cut == nil {
		t.Skip("the pipe cannot reach below its layer (Pipe.Cut is nil): a stream cut there was not checked")
	}
	a, b := p.ends(from)
	const size = 100 << 10
	want := newData(11)
	written := make(chan error, 1)
	go func() {
		_, err := io.Copy(a, io.LimitReader(newData(11), size))
		written <- err
	}()
	b.SetReadDeadline(time.Now().Add(endWait))
	if _, err := readSent(b, want, size); err != nil {
		t.Fatalf("the %v before the cut: %v", from.peer(), err)
	}
	if err := <-written; err != nil {
		t.Fatalf("the %v wrote: %v", from, err)
	}
	if err := p.Cut(a); err != nil {
		t.Fatalf("cut below the %v: %v", from, err)
	}
	b.SetReadDeadline(time.Now().Add(endWait))
	n, err := readSent(b, want, -1)
	cut := fmt.Sprintf("the stream from the %v was cut below its layer, without its end; the %v read %d more bytes, then %v", from, from.peer(), n, describe(err))
	switch {
	case errors.Is(err, errNotSent):
		t.Errorf("%s", cut)
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Errorf("%s: it was not told within %v", cut, endWait)
	case opts.EndMarker && (err == io.EOF || errors.Is(err, io.EOF)):
		t.Errorf("%s: a layer with end markers must read a stream that ends without one as an error, never as a clean end", cut)
	case opts.EndMarker && !isOpError(err):
		t.Errorf("%s (%T): want a *net.OpError naming the layer", cut, err)
	case opts.EndMarker:
		t.Logf("%s", cut)
	case err == io.EOF:
		t.Skipf("%s, as the layer declares no end marker: it cannot tell a truncated stream from a complete one", cut)
	default:
		t.Errorf("%s: the layer declares no end marker, yet tells a cut from an end; if it has one, declare it (Options.EndMarker, layer.Spec.EndMarker)", cut)
	}
}

func (e end) peer() end { return 1 - e }

// describe writes an error as a test reports it: io.EOF by its name.
func describe(err error) string {
	if err == io.EOF {
		return "io.EOF"
	}
	return err.Error()
}

// isOpError reports whether err is (or wraps) a *net.OpError, as the
// errors of a layer's connections are.
func isOpError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}

// errNotSent is matched when an end reads bytes its peer did not send.
var errNotSent = errors.New("read bytes that were not sent")

// readSent reads limit bytes from c (until an error if limit < 0),
// checking them against the next bytes of want. It returns how many it
// read, and the error that ended the read (nil once limit is reached).
func readSent(c net.Conn, want io.Reader, limit int64) (int64, error) {
	buf, exp := make([]byte, 32<<10), make([]byte, 32<<10)
	var total int64
	for limit < 0 || total < limit {
		p := buf
		if limit >= 0 && int64(len(p)) > limit-total {
			p = p[:limit-total]
		}
		n, err := c.Read(p)
		if n > 0 {
			io.ReadFull(want, exp[:n])
			if i := mismatch(p[:n], exp[:n]); i >= 0 {
				return total, fmt.Errorf("%w: byte %d of the stream differs", errNotSent, total+int64(i))
			}
			total += int64(n)
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// mismatch returns the index of the first byte where a and b differ, or
// -1.
func mismatch(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

package mux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fuzzWait bounds every wait of FuzzSession: far beyond what a session
// needs on a loaded machine, so it only catches a session that hangs.
const fuzzWait = 10 * time.Second

// junk is a layer.Junction for the fuzz target: it reads every stream the
// session delivers to its end, as a listener would, and records how each
// ended, and then whether its writes fail: after a clean end, once the
// stream's drainer is done. Streams stay open until the test closes them,
// so a stream the peer finished is never forgotten by smux and opened
// again.
type junk struct {
	done chan struct{}

	mu        sync.Mutex
	delivered map[uint32]*received
	streams   []net.Conn
	byID      map[uint32]*stream // the first stream delivered with each id
	changed   chan struct{}      // a stream was delivered
	wg        sync.WaitGroup
}

// received is how one delivered stream ended: the bytes it read and the
// error that stopped it (nil for a clean end of stream), and what its
// writes fail with once it has read all it will.
type received struct {
	twice bool // the same stream id was delivered again
	n     int64
	err   error
	// Set if the stream took the peer for gone (its close mark, or a FIN
	// without the end record): what writes fail with, and what a Write
	// then failed with.
	gone, writeErr error
}

func newJunk() *junk {
	return &junk{done: make(chan struct{}), delivered: map[uint32]*received{}, byID: map[uint32]*stream{}, changed: make(chan struct{}, 1)}
}

func (j *junk) Deliver(c net.Conn) error {
	id := c.(*stream).st.ID()
	r := &received{}
	j.mu.Lock()
	if old := j.delivered[id]; old != nil {
		old.twice = true
	} else {
		j.delivered[id] = r
		j.byID[id] = c.(*stream)
	}
	j.streams = append(j.streams, c)
	j.mu.Unlock()
	select {
	case j.changed <- struct{}{}:
	default:
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		if id%4 == 1 {
			// Read, in pieces smaller than a header and a record.
			r.n, r.err = readAll(c, 5)
		} else {
			r.n, r.err = io.Copy(io.Discard, c) // WriteTo
		}
		s := c.(*stream)
		if r.err == nil {
			// The drainer looks for the close mark until the stream's
			// end below: the peer's FIN, or the session's end.
			<-s.drained
		}
		if gone := s.gone.Load(); gone != nil {
			r.gone = *gone
			_, r.writeErr = c.Write([]byte("x"))
		}
	}()
	return nil
}

// readAll reads c to its end through Read, size bytes at a time.
func readAll(c net.Conn, size int) (int64, error) {
	var n int64
	buf := make([]byte, size)
	for {
		m, err := c.Read(buf)
		n += int64(m)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// gone is what writes to the stream with this id fail with now: nil
// until it takes the peer for gone.
func (j *junk) gone(id uint32) error {
	j.mu.Lock()
	s := j.byID[id]
	j.mu.Unlock()
	if s == nil {
		return nil
	}
	if gone := s.gone.Load(); gone != nil {
		return *gone
	}
	return nil
}

func (j *junk) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.delivered)
}

// endConn is the connection under the session: it tells when the session
// closes it, the end of the session as its peer sees it.
type endConn struct {
	net.Conn
	once  sync.Once
	ended chan struct{}
}

func (c *endConn) Close() error {
	c.once.Do(func() { close(c.ended) })
	return c.Conn.Close()
}

func (j *junk) State(string, func() any) any { return nil }
func (j *junk) Done() <-chan struct{}        { return j.done }
func (j *junk) Timeout() time.Duration       { return time.Second }
func (j *junk) MaxPending() int              { return 16 }
func (j *junk) RemoteAddr() net.Addr         { return nil }

// Frame commands of smux's protocol version 2.
const (
	cmdSYN byte = iota
	cmdFIN
	cmdPSH
	cmdNOP
	cmdUPD
)

// sent is what the peer sent one stream: the frames' payloads before its
// FIN, all of them, and whether a FIN came.
type sent struct {
	beforeFIN, all []byte
	fin            bool
}

// unrecord is the stream's records as a reader must see them, decoded
// here as plainly as possible: the payload bytes up to the end record (or
// to where b runs out), whether the end record came, and whether a byte
// came after it (the close mark).
func unrecord(b []byte) (payload int64, ended, marked bool) {
	for len(b) >= headerSize {
		n := int(b[0])<<8 | int(b[1])
		if n == 0 {
			return payload, true, len(b) > headerSize
		}
		b = b[headerSize:]
		payload += int64(min(n, len(b)))
		if n >= len(b) {
			break
		}
		b = b[n:]
	}
	return payload, false, false
}

// script is what a correct session must make of the peer's bytes, read
// frame by frame as smux reads them: the streams opened, and whether a
// frame it must reject (a wrong version, an unknown command, a length
// the command forbids) came before the bytes ran out.
type script struct {
	opened   map[uint32]*sent
	bad      string // why the first rejected frame is rejected, "" if none
	badAt    int    // and its offset
	complete bool   // the bytes end on a frame boundary
}

func readScript(b []byte) script {
	s := script{opened: map[uint32]*sent{}}
	for off := 0; ; {
		if off == len(b) {
			s.complete = true
			return s
		}
		if len(b)-off < 8 {
			return s
		}
		h := b[off : off+8]
		cmd, n, sid := h[1], int(binary.LittleEndian.Uint16(h[2:])), binary.LittleEndian.Uint32(h[4:])
		st := s.opened[sid]
		switch {
		case h[0] != 2:
			s.bad = fmt.Sprintf("version %d", h[0])
		case cmd > cmdUPD:
			s.bad = fmt.Sprintf("command %d", cmd)
		case cmd == cmdUPD && n != 8, cmd != cmdUPD && cmd != cmdPSH && n != 0:
			s.bad = fmt.Sprintf("command %d with %d bytes", cmd, n)
		}
		if s.bad != "" {
			s.badAt = off
			return s
		}
		if len(b)-off-8 < n {
			return s // smux waits for the rest of the frame
		}
		switch {
		case cmd == cmdSYN && st == nil:
			s.opened[sid] = &sent{}
		case cmd == cmdFIN && st != nil:
			st.fin = true
		case cmd == cmdPSH && st != nil:
			data := b[off+8 : off+8+n]
			st.all = append(st.all, data...)
			if !st.fin {
				st.beforeFIN = append(st.beforeFIN, data...)
			}
		}
		off += 8 + n
	}
}

// FuzzSession feeds arbitrary bytes to the accepting side of a session,
// as a hostile dialer would, and checks what the listener sees: the
// streams opened are delivered (no other); a stream ends cleanly only
// after its end record, with the records' payload; one the peer did not
// finish ends with ErrAborted (a FIN, no end record) or ErrSessionClosed
// (neither); a stream's writes fail with EPIPE once a byte follows its
// end record before its FIN (the close mark), with ECONNRESET after an
// abort, and never for another reason than these; a frame
// smux must reject ends the session at once, with the peer's connection
// still open; the end of the connection ends it too. Nothing hangs,
// panics, leaves a goroutine behind or allocates out of proportion to the
// input, and each input's session is over before the next starts.
func FuzzSession(f *testing.F) {
	frame := func(cmd byte, sid uint32, data []byte) []byte {
		b := []byte{2, cmd, byte(len(data)), byte(len(data) >> 8), byte(sid), byte(sid >> 8), byte(sid >> 16), byte(sid >> 24)}
		return append(b, data...)
	}
	join := func(frames ...[]byte) []byte {
		var b []byte
		for _, f := range frames {
			b = append(b, f...)
		}
		return b
	}
	rec := func(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }
	end, mark := []byte(endRecord), []byte(closeMark)
	for _, seed := range [][]byte{
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, join(rec("closed"), end, mark)), frame(cmdFIN, 3, nil)),
		join(frame(cmdSYN, 5, nil), frame(cmdPSH, 5, join(rec("half-closed"), end)), frame(cmdPSH, 5, mark), frame(cmdFIN, 5, nil)),
		join(frame(cmdSYN, 5, nil), frame(cmdPSH, 5, join(rec("old peer"), end)), frame(cmdFIN, 5, nil), frame(cmdPSH, 5, mark)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, join(rec("marked, no FIN"), end, mark, []byte("junk after the mark")))),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, join(rec("hi"), end)), frame(cmdFIN, 3, nil)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, rec("aborted")), frame(cmdFIN, 3, nil)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, rec("split ")[:1]), frame(cmdPSH, 3, rec("split ")[1:5]),
			frame(cmdPSH, 3, join(rec("split ")[5:], rec("records"), end[:1])), frame(cmdPSH, 3, end[1:]), frame(cmdFIN, 3, nil)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, join(rec("ended, no FIN"), end, []byte("after the end")))),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, rec("end after the FIN")), frame(cmdFIN, 3, nil), frame(cmdPSH, 3, end)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, []byte{0xff, 0xff, 'x'}), frame(cmdFIN, 3, nil)),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, []byte("never finished"))),
		join(frame(cmdSYN, 3, nil), frame(cmdSYN, 5, nil), frame(cmdFIN, 3, nil), frame(cmdSYN, 3, nil), frame(cmdPSH, 3, []byte("late"))),
		frame(cmdPSH, 5, []byte("data for a stream never opened")),
		join(frame(cmdNOP, 0, nil), frame(cmdUPD, 3, make([]byte, 8))),
		join(frame(cmdSYN, 3, nil), frame(cmdPSH, 3, []byte("then garbage")), []byte{9, 9, 9, 9, 9, 9, 9, 9}),
		join(frame(cmdSYN, 3, nil), frame(7, 3, nil)),
		join(frame(cmdSYN, 3, nil), frame(cmdFIN, 3, []byte("x"))),
		frame(cmdUPD, 3, make([]byte, 4)),
		frame(cmdSYN, 3, nil)[:5],
		frame(cmdPSH, 3, make([]byte, 100))[:50],
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4<<20 {
			// Data for streams that ended stays in the session's 8 MiB
			// receive buffer until they close (the test closes them
			// last): past it, flow control rightly stops reading.
			t.Skip("input larger than the session's receive buffer")
		}
		want := readScript(data)
		ignore := goleak.IgnoreCurrent()
		var m0 runtime.MemStats
		runtime.ReadMemStats(&m0)

		pipe, far := net.Pipe()
		defer far.Close() // on a failure, frees the goroutines below
		near := &endConn{Conn: pipe, ended: make(chan struct{})}
		l, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		j := newJunk()
		defer close(j.done) // after the checks: the session must end without the listener closing
		if err := l.Accept(near, j); err != nil {
			t.Fatal(err)
		}
		wrote := make(chan struct{})
		go func() {
			far.Write(data) // ends when the session has read it all, or either end closes
			close(wrote)
		}()
		// The peer reads what the session sends (window updates).
		peerDone := make(chan struct{})
		go func() {
			io.Copy(io.Discard, far)
			close(peerDone)
		}()
		deadline := time.NewTimer(fuzzWait) // for the whole input
		defer deadline.Stop()

		if want.bad != "" {
			select {
			case <-near.ended:
			case <-deadline.C:
				t.Fatalf("%s at offset %d: the session is still open after %v", want.bad, want.badAt, fuzzWait)
			}
		} else {
			select {
			case <-wrote:
			case <-deadline.C:
				t.Fatal("the session stopped reading well-formed frames")
			}
			for j.count() < len(want.opened) {
				select {
				case <-j.changed:
				case <-deadline.C:
					t.Fatalf("%d of the %d streams opened were delivered", j.count(), len(want.opened))
				}
			}
			select {
			case <-near.ended:
				t.Fatal("well-formed frames ended the session")
			default:
			}
			// A close mark must be seen while the session lives: when it
			// ends, smux drops what its streams have not read, the mark
			// too if the drainer has not reached it.
			for id, st := range want.opened {
				if _, ended, marked := unrecord(st.beforeFIN); !ended || !marked {
					continue
				}
				for j.gone(id) == nil {
					select {
					case <-deadline.C:
						t.Fatalf("stream %d: its peer's close mark came %v ago; writes do not fail", id, fuzzWait)
					case <-time.After(time.Millisecond):
					}
				}
			}
		}
		far.Close()
		select {
		case <-near.ended:
		case <-deadline.C:
			t.Fatalf("the session is still open %v after its connection ended", fuzzWait)
		}
		// The session closed its connection after its last Deliver: every
		// stream is counted.
		readersDone := make(chan struct{})
		go func() {
			j.wg.Wait()
			close(readersDone)
		}()
		select {
		case <-readersDone:
		case <-deadline.C:
			t.Fatalf("streams still reading %v after their session ended", fuzzWait)
		}
		<-wrote
		<-peerDone

		for id, r := range j.delivered {
			st := want.opened[id]
			if st == nil {
				t.Errorf("stream %d delivered, never opened", id)
				continue
			}
			// Every frame before the FIN is read before the stream's end;
			// one after it may or may not be. The session may fail a
			// reader before it has read all (a window update it sends
			// fails once the connection is gone): an error, never a clean
			// end, and never taken for the peer's abort.
			n1, ended1, marked1 := unrecord(st.beforeFIN)
			n2, ended2, marked2 := unrecord(st.all)
			switch {
			case r.twice:
				t.Errorf("stream %d delivered twice", id)
			case ended1 && (r.err == nil && r.n != n1 || errors.Is(r.err, ErrAborted)):
				t.Errorf("stream %d: %d bytes then %v; its end record came before its FIN, after %d bytes", id, r.n, r.err, n1)
			case r.err == nil && !ended2:
				t.Errorf("stream %d ended cleanly after %d bytes, but the peer never sent its end record", id, r.n)
			case r.err == nil && r.n != n2:
				t.Errorf("stream %d ended cleanly after %d bytes; the peer sent %d before its end record", id, r.n, n2)
			case errors.Is(r.err, ErrAborted) && !st.fin:
				t.Errorf("stream %d: %v, but the peer sent no FIN: want ErrSessionClosed", id, r.err)
			case r.err != nil && !errors.Is(r.err, ErrAborted) && !errors.Is(r.err, ErrSessionClosed):
				t.Errorf("stream %d ended with %v, want ErrSessionClosed, ErrAborted or a clean end", id, r.err)
			case r.n > n2:
				t.Errorf("stream %d read %d bytes (%v); the peer's records hold %d", id, r.n, r.err, n2)
			// Its writes, once it has read all it will.
			case r.err == nil && marked1 && r.gone != errPeerClosed && (want.bad == "" || r.gone != nil):
				// After a rejected frame the session may end before the
				// drainer reads the mark: writes then fail as the
				// session's do.
				t.Errorf("stream %d: the peer's close mark came before its FIN; writes fail with %v, want %v", id, r.gone, errPeerClosed)
			case r.err == nil && !marked2 && r.gone != nil:
				t.Errorf("stream %d: writes fail with %v; the peer sent no close mark", id, r.gone)
			case errors.Is(r.err, ErrAborted) && r.gone != errPeerReset:
				t.Errorf("stream %d: %v; writes fail with %v, want %v", id, r.err, r.gone, errPeerReset)
			case r.err != nil && !errors.Is(r.err, ErrAborted) && r.gone != nil:
				t.Errorf("stream %d: %v; writes fail with %v, but the peer sent no FIN", id, r.err, r.gone)
			case r.gone != nil && !errors.Is(r.writeErr, r.gone):
				t.Errorf("stream %d: a Write after the peer left: %v, want %v", id, r.writeErr, r.gone)
			}
		}
		for _, c := range j.streams {
			c.Close()
		}

		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		// A frame's payload is read into a buffer of up to twice its
		// size, and the last may claim 64 KiB it never sends; a stream
		// (8 bytes of SYN) costs about 3 KiB. A session costs about
		// 150 KiB: 512 KiB and 4 KiB per input byte cover all that, not a
		// per-stream buffer of the window's size.
		if got, limit := m1.TotalAlloc-m0.TotalAlloc, uint64(512<<10+4<<10*len(data)); got > limit {
			t.Errorf("%d bytes allocated for %d bytes of input, want at most %d", got, len(data), limit)
		}
		// The session's goroutines end with it; they may take a moment.
		for {
			err := goleak.Find(ignore)
			if err == nil {
				break
			}
			select {
			case <-deadline.C:
				t.Fatalf("goroutines left behind %v after the session ended: %v", fuzzWait, err)
			default:
			}
		}
	})
}

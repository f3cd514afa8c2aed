//go:build linux

package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn/framed"
	"golang.org/x/sys/unix"
)

// ErrReset: the peer aborted the connection, or went away without
// closing it (its process died): what was received is not the whole
// stream. It matches framed.ErrReset (and syscall.ECONNRESET), as the
// framed layers' and vio's resets do.
var ErrReset = fmt.Errorf("shm: %w", framed.ErrReset)

// bells are a side's eventfd doorbells. It sleeps on two (files, so
// the runtime's poller waits and deadlines apply) and rings the other
// two (plain descriptors: a write of 1). A bell rung while its sleeper
// runs is a wake-up it finds spurious, which is harmless.
type bells struct {
	waitData, waitRoom *os.File // rung when in has data, when out has room
	ringData, ringRoom int      // out has data, in has room
}

// wakeData and wakeRoom wake this side's sleepers, on their futex or
// their doorbell: the control socket brought news.
func (c *conn) wakeData() { wakeFutex(c.in.wantData); wake(c.b.waitData) }
func (c *conn) wakeRoom() { wakeFutex(c.out.wantRoom); wake(c.b.waitRoom) }

// wake rings one of this side's own bells, to wake its sleeper.
func wake(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Write(func(fd uintptr) bool {
			ringFd(int(fd))
			return true
		})
	}
}

func ringFd(fd int) {
	one := [8]byte{1}
	unix.Write(fd, one[:])
}

// wait sleeps on bell f until it is rung, its deadline passes or it is
// closed.
func wait(f *os.File) error {
	var b [8]byte
	_, err := f.Read(b[:])
	return err
}

// conn is one end of a shared-memory connection: two rings in one
// mapping, four doorbells, and the unix socket it was set up on, which
// carries the end markers and tells when the peer's process is gone.
type conn struct {
	mem       []byte
	in, out   *ring
	b         bells
	ctl       *net.UnixConn
	laddr     net.Addr
	raddr     net.Addr
	rmu, wmu  sync.Mutex
	memMu     sync.RWMutex // over the unmapping, for wakeForDeadline
	rdl, wdl  deadline
	finIn     atomic.Int64 // the peer's end marker: its byte count, or -1
	reset     atomic.Bool  // the peer aborted or is gone without an end marker
	wclosed   bool         // under wmu
	ctlMu     sync.Mutex   // one control message at a time
	closed    atomic.Bool
	closeOnce sync.Once
	ctlDone   chan struct{}
}

var _ net.Conn = (*conn)(nil)

// newConn starts a connection over mem, whose rings are size bytes;
// side 0 (the dialer) produces into ring 0 and consumes ring 1, side 1
// the other way.
func newConn(mem []byte, size int, b bells, ctl *net.UnixConn, side int, laddr, raddr net.Addr) *conn {
	rings := [2]*ring{newRing(mem, size), newRing(mem[ringHeader+size:], size)}
	c := &conn{mem: mem, in: rings[1-side], out: rings[side], b: b, ctl: ctl, laddr: laddr, raddr: raddr, ctlDone: make(chan struct{})}
	c.finIn.Store(-1)
	go c.control()
	return c
}

// control reads the peer's end markers off the unix socket, and wakes
// this side's sleepers when it aborts or its process goes away.
func (c *conn) control() {
	defer close(c.ctlDone)
	for {
		m, err := readCtl(c.ctl)
		if err == nil && m.op == opFin && c.finIn.Load() < 0 {
			c.finIn.Store(int64(m.n))
			c.wakeData()
			continue
		}
		if c.closed.Load() {
			return // this side's Close ended the socket
		}
		// An abort, a second end marker, a malformed message or the
		// socket's end: writes fail from now on. Reads still end at an
		// end marker received before: the peer closed after it.
		c.reset.Store(true)
		c.wakeData()
		c.wakeRoom()
		return
	}
}

func (c *conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "shm", Source: c.laddr, Addr: c.raddr, Err: err}
}

func (c *conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n, err := c.awaitData(len(p) > 0)
	if err != nil {
		return 0, c.readErr(err)
	}
	if n == 0 {
		return 0, nil
	}
	k := c.in.get(p, n)
	c.consumed()
	return k, nil
}

// WriteTo writes what the peer sends to w until its end, straight from
// the ring: one copy fewer than Read into a buffer, then Write (a relay
// to a socket takes it).
func (c *conn) WriteTo(w io.Writer) (int64, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	var total int64
	for {
		n, err := c.awaitData(true)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, c.readErr(err)
		}
		k, werr := w.Write(c.in.region(n))
		c.in.read(uint64(k))
		c.consumed()
		total += int64(k)
		if werr != nil {
			return total, werr
		}
	}
}

func (c *conn) readErr(err error) error {
	if err == io.EOF {
		return err
	}
	return c.opErr("read", err)
}

// consumed wakes the producer if it sleeps for room.
func (c *conn) consumed() {
	notify(c.in.wantRoom, c.b.ringRoom)
}

// awaitData returns how many bytes the ring holds for this side, once
// it holds some (when block; else at once, 0 for none), or why it never
// will: io.EOF at the peer's end marker. rmu held.
func (c *conn) awaitData(block bool) (uint64, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	for {
		if c.rdl.exceeded() {
			return 0, os.ErrDeadlineExceeded
		}
		n, err := c.in.readable()
		if err != nil {
			c.fail()
			return 0, err
		}
		if n > 0 {
			return n, nil
		}
		if fin := c.finIn.Load(); fin >= 0 {
			// The marker came after the last bytes' tail: look again,
			// the tail read above may be older than the marker.
			if n, _ := c.in.readable(); n > 0 {
				continue
			}
			if uint64(fin) != c.in.mine {
				c.fail()
				return 0, fmt.Errorf("%w: its end marker counts %d bytes, it sent %d", errCorrupt, fin, c.in.mine)
			}
			return 0, io.EOF
		}
		if c.reset.Load() {
			return 0, ErrReset
		}
		if !block {
			return 0, nil
		}
		// Spin a moment first: a peer that answers within it is read
		// without a doorbell and a wake-up, which cost more than the
		// round trip itself.
		ready := func() bool { n, _ := c.in.readable(); return n > 0 || c.finIn.Load() >= 0 || c.reset.Load() }
		if spin(ready) {
			continue
		}
		if err := c.sleep(c.in.wantData, c.b.waitData, &c.rdl, ready); err != nil {
			return 0, c.waitErr(err)
		}
	}
}

func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writeState(); err != nil {
		return 0, c.opErr("write", err)
	}
	written := 0
	for len(p) > 0 {
		// What is in the ring is written: a peer that goes away after
		// it fails the next write, not this one.
		room, err := c.awaitRoom()
		if err != nil {
			return written, c.opErr("write", err)
		}
		k := c.out.put(p, room)
		written += k
		p = p[k:]
		c.produced()
	}
	return written, nil
}

// ReadFrom reads r to its end straight into the ring: one copy fewer
// than Read into a buffer, then Write (a relay from a socket takes it).
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var total int64
	for {
		room, err := c.awaitRoom()
		if err != nil {
			return total, c.opErr("write", err)
		}
		k, rerr := r.Read(c.out.region(room))
		c.out.wrote(uint64(k))
		c.produced()
		total += int64(k)
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// produced wakes the consumer if it sleeps for data.
func (c *conn) produced() {
	notify(c.out.wantData, c.b.ringData)
}

// writeState returns why this side cannot write, or nil. wmu held.
func (c *conn) writeState() error {
	switch {
	case c.closed.Load():
		return net.ErrClosed
	case c.wclosed:
		return framed.ErrWriteShut
	case c.reset.Load():
		return ErrReset
	case c.wdl.exceeded():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// awaitRoom returns the room in the ring, once there is some, or why
// there will be none. wmu held.
func (c *conn) awaitRoom() (uint64, error) {
	for {
		if err := c.writeState(); err != nil {
			return 0, err
		}
		room, err := c.out.writable()
		if err != nil {
			c.fail()
			return 0, err
		}
		if room > 0 {
			return room, nil
		}
		ready := func() bool { n, _ := c.out.writable(); return n > 0 || c.reset.Load() }
		if spin(ready) {
			continue
		}
		if err := c.sleep(c.out.wantRoom, c.b.waitRoom, &c.wdl, ready); err != nil {
			return 0, c.waitErr(err)
		}
	}
}

// fail ends a connection whose peer broke the protocol: the peer is
// told (an abort), and this side's I/O fails from now on.
func (c *conn) fail() {
	c.send(ctlMsg{op: opRst})
	c.reset.Store(true)
}

func (c *conn) send(m ctlMsg) error {
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	return writeCtl(c.ctl, m)
}

func (c *conn) waitErr(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return os.ErrDeadlineExceeded
	case errors.Is(err, os.ErrClosed) || c.closed.Load():
		return net.ErrClosed
	}
	return err
}

// CloseWrite ends the stream this side sends: the peer reads what was
// written, then io.EOF.
func (c *conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed.Load() {
		return c.opErr("close", net.ErrClosed)
	}
	return c.closeWrite()
}

// closeWrite sends the end marker once; wmu held.
func (c *conn) closeWrite() error {
	if c.wclosed {
		return nil
	}
	c.wclosed = true
	if err := c.send(ctlMsg{op: opFin, n: c.out.mine}); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

// Close ends the connection: what was written is delivered, then the
// peer reads io.EOF.
func (c *conn) Close() error { return c.close(false) }

// Abort ends the connection so that the peer reads an error, not the
// end of the stream (netconn.Abort).
func (c *conn) Abort() error { return c.close(true) }

func (c *conn) close(abort bool) error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = nil
		if abort {
			c.send(ctlMsg{op: opRst})
		} else {
			// The end marker, unless a writer holds wmu: then the peer
			// sees the socket end without one, as an abort.
			if c.wmu.TryLock() {
				c.closeWrite()
				c.wmu.Unlock()
			}
		}
		c.closed.Store(true)
		wakeFutex(c.in.wantData) // wakes this side's sleepers on futexes
		wakeFutex(c.out.wantRoom)
		c.ctl.Close()
		c.b.waitData.Close() // wakes this side's sleepers
		c.b.waitRoom.Close()
		<-c.ctlDone
		// Unmapped, and the other bells closed, once no Read or Write
		// can touch them.
		c.rmu.Lock()
		c.wmu.Lock()
		c.memMu.Lock()
		unix.Close(c.b.ringData)
		unix.Close(c.b.ringRoom)
		unix.Munmap(c.mem)
		c.mem = nil
		c.memMu.Unlock()
		c.wmu.Unlock()
		c.rmu.Unlock()
	})
	if err != nil {
		return c.opErr("close", err)
	}
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.laddr }
func (c *conn) RemoteAddr() net.Addr { return c.raddr }

func (c *conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t)
	c.b.waitData.SetReadDeadline(t)
	c.wakeForDeadline(c.in.wantData)
	return nil
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t)
	c.b.waitRoom.SetReadDeadline(t)
	c.wakeForDeadline(c.out.wantRoom)
	return nil
}

// wakeForDeadline wakes a sleeper on want's futex, so that it looks at
// its new deadline, unless a Close has unmapped the memory meanwhile:
// the deadline's setter holds neither rmu nor wmu, which a sleeper does.
func (c *conn) wakeForDeadline(want *uint32) {
	c.memMu.RLock()
	defer c.memMu.RUnlock()
	if c.mem != nil {
		wakeFutex(want)
	}
}

// deadline is a deadline's time, for the check before each attempt: a
// deadline in the past fails I/O even when it could proceed, as the net
// package's does.
type deadline struct {
	t atomic.Int64 // unix nanoseconds; 0: none
}

func (d *deadline) set(t time.Time) {
	if t.IsZero() {
		d.t.Store(0)
		return
	}
	d.t.Store(t.UnixNano())
}

func (d *deadline) exceeded() bool {
	t := d.t.Load()
	return t != 0 && time.Now().UnixNano() >= t
}

package dgram

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrIdle is Relay's error when the session fell idle.
var ErrIdle = errors.New("dgram: no datagram for the idle timeout")

// Counts are what one direction of a relay carried.
type Counts struct {
	Datagrams, Bytes int64
	// Errors are the socket errors passed on (ECONNREFUSED, ...).
	Errors int64
}

// Relay copies datagrams between a and b, each one read from one side
// written whole to the other, until a side ends or fails, or, with idle
// above zero, until no datagram has crossed either way for idle (noticed
// within twice that), as a NAT forgets a mapping. It closes neither; it interrupts a side's
// pending Read through its read deadline to stop, so both must honour
// one.
//
// A socket error that a datagram's sender would see (ECONNREFUSED for an
// ICMP port unreachable, ...) ends nothing: it is handed to the other
// side when that is a *Conn, which carries it to the program that sent,
// and otherwise dropped, as a router drops an ICMP message it cannot
// return.
//
// Relay returns nil when a side ended cleanly (io.EOF) or was closed
// (net.ErrClosed: a Session whose Listener closed), ErrIdle when the
// session fell idle, and otherwise the first failure. ab counts what went
// from a to b, ba the other way.
func Relay(a, b net.Conn, idle time.Duration) (ab, ba Counts, err error) {
	r := &relay{a: a, b: b}
	if idle > 0 {
		r.timer = time.AfterFunc(idle, func() { r.checkIdle(idle) })
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.copy(b, a, &ab)
	}()
	r.copy(a, b, &ba)
	wg.Wait()
	if r.timer != nil {
		r.timer.Stop()
	}
	return ab, ba, r.err
}

type relay struct {
	a, b net.Conn
	// crossed is set by each datagram, and cleared by each idle check:
	// no clock read per datagram, at the price of noticing idleness
	// between idle and twice idle.
	crossed atomic.Bool
	timer   *time.Timer

	mu      sync.Mutex
	stopped bool
	err     error
}

// touch records that a datagram crossed.
func (r *relay) touch() {
	if !r.crossed.Load() { // a read, not a write, on the hot path
		r.crossed.Store(true)
	}
}

// stop records why the relay ends, once, and interrupts both sides.
func (r *relay) stop(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopped, r.err = true, err
	past := time.Unix(1, 0)
	r.a.SetReadDeadline(past)
	r.b.SetReadDeadline(past)
}

func (r *relay) checkIdle(idle time.Duration) {
	if !r.crossed.Swap(false) {
		r.stop(ErrIdle)
		return
	}
	r.timer.Reset(idle)
}

// batchBytes bounds the datagrams a relay writes to a stream at once.
const batchBytes = 64 << 10

// copy carries datagrams from src to dst until the relay stops.
func (r *relay) copy(dst, src net.Conn, n *Counts) {
	if s, ok := src.(*Session); ok {
		if c, ok := dst.(*Conn); ok {
			r.copyBatches(c, s, n)
			return
		}
	}
	buf := make([]byte, MaxDatagram)
	for {
		m, err := src.Read(buf)
		if err == nil {
			r.touch()
			_, err = dst.Write(buf[:m])
			if err == nil {
				n.Datagrams++
				n.Bytes += int64(m)
				continue
			}
			if _, crosses := codeOf(err); crosses {
				// The datagram went nowhere, as it would have from the
				// program's own socket; the error goes back to it.
				r.pass(src, err, n)
				continue
			}
			r.stop(err)
			return
		}
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			r.stop(nil) // the far side's end, or ours: a Session whose Listener closed
			return
		}
		if _, crosses := codeOf(err); crosses {
			r.pass(dst, err, n)
			continue
		}
		r.stop(err)
		return
	}
}

// pass hands a socket error on to c when it can carry it.
func (r *relay) pass(c net.Conn, err error, n *Counts) {
	dc, ok := c.(*Conn)
	if !ok {
		return
	}
	if _, werr := dc.WriteError(err); werr != nil {
		r.stop(werr)
		return
	}
	n.Errors++
}

// copyBatches is copy from a Listener's client to a stream: what waits
// in the session's queue goes in one write.
func (r *relay) copyBatches(dst *Conn, src *Session, n *Counts) {
	var batch [][]byte
	for {
		var err error
		batch, err = src.readBatch(batch[:0], batchBytes)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				r.stop(nil)
			} else {
				r.stop(err)
			}
			return
		}
		r.touch()
		if err := dst.writeBatch(batch); err != nil {
			r.stop(err)
			return
		}
		for _, d := range batch {
			n.Datagrams++
			n.Bytes += int64(len(d))
		}
	}
}

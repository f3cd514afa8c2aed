package dgram

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// A Carrier carries datagrams beside a stream, unreliably: QUIC
// DATAGRAM frames (RFC 9221) on the stream's QUIC connection. It is
// vlink/layer.DatagramCarrier (the same methods; this package does not
// import vlink's).
type Carrier interface {
	// SendDatagram sends b as one datagram; it fails for one larger
	// than the carrier takes.
	SendDatagram(b []byte) error
	// ReceiveDatagram returns the next datagram, waiting until ctx ends
	// or the carrier is closed.
	ReceiveDatagram(ctx context.Context) ([]byte, error)
	// MaxDatagram is the largest datagram SendDatagram takes now.
	MaxDatagram() int
}

// A ReadyCarrier is a Carrier whose waiting datagrams Read takes itself,
// with no goroutine between (factories/quic's): a hand-off less per
// datagram.
type ReadyCarrier interface {
	Carrier
	// TakeDatagram returns a datagram that waits, if one does; it never
	// blocks.
	TakeDatagram() ([]byte, bool)
	// DatagramReady receives (its capacity is 1) once a datagram may
	// wait, or the carrier closed.
	DatagramReady() <-chan struct{}
}

// NewConnOver returns a Conn that carries datagrams over carrier where
// they fit (MaxDatagram), and over stream, framed as NewConn frames
// them, where they do not (or the carrier fails to take one): nothing
// is refused for its size that NewConn takes. What carrier carries may
// be lost or reordered, alone, as UDP's datagrams are; a lost one
// delays no other. Read returns the datagram that arrived first, from
// either; the far side's socket errors and the stream's end still come
// on the stream. A nil carrier is NewConn.
//
// A goroutine reads the stream until Close, into a queue of 64
// datagrams that Read takes from, and another the carrier (unless it is
// a ReadyCarrier, which Read takes from itself): a Read deadline is the
// Conn's own (the stream's is never set), and a frame arrives whole or
// not at all. The stream is not read while that queue is full, so a
// reader that falls behind holds the stream's sender back as on
// NewConn's Conn; the carrier drops, below, what its own queue cannot
// hold.
func NewConnOver(stream net.Conn, carrier Carrier, local, remote net.Addr) *Conn {
	c := NewConn(stream, local, remote)
	if carrier == nil {
		return c
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &over{
		carrier: carrier,
		cancel:  cancel,
		in:      make(chan item, 64),
		done:    make(chan struct{}),
		rdl:     newDeadline(),
	}
	c.over = o
	go o.pumpStream(c)
	if rc, ok := carrier.(ReadyCarrier); ok {
		o.ready = rc
	} else {
		go o.pumpCarrier(ctx)
	}
	return c
}

// over is the state of a Conn with a Carrier.
type over struct {
	carrier Carrier
	ready   ReadyCarrier // carrier, when Read takes from it itself; nil otherwise
	cancel  context.CancelFunc
	in      chan item
	done    chan struct{} // closed by Close
	once    sync.Once
	rdl     *deadline
	// max is the largest datagram the carrier took last asked; a larger
	// one asks again.
	max atomic.Int64
}

// item is what the pumps hand Read: a datagram, or an error. A final
// error ends the Conn's reading (the stream's end, its failure, a
// malformed frame); another (an errno the far side's socket reported)
// is returned once.
type item struct {
	d     []byte
	err   error
	final bool
}

// put hands it to Read, unless the Conn is closed first.
func (o *over) put(it item) bool {
	select {
	case o.in <- it:
		return true
	case <-o.done:
		return false
	}
}

func (o *over) pumpStream(c *Conn) {
	for {
		body, errno, err := c.frame()
		switch {
		case errno != nil:
			if !o.put(item{err: errno}) {
				return
			}
		case err != nil:
			o.put(item{err: err, final: true})
			return
		default:
			d := append([]byte(nil), body...)
			c.r.Discard(HeaderSize + len(body))
			if !o.put(item{d: d}) {
				return
			}
		}
	}
}

func (o *over) pumpCarrier(ctx context.Context) {
	for {
		d, err := o.carrier.ReceiveDatagram(ctx)
		if err != nil {
			// The stream says how the session ends: the carrier ends
			// with it (closed), or with its connection, whose end the
			// stream reports too.
			return
		}
		if !o.put(item{d: d}) {
			return
		}
	}
}

// read is Read's, under rmu.
func (o *over) read(c *Conn, b []byte) (int, error) {
	select {
	case <-o.done:
		return 0, c.opError("read", net.ErrClosed)
	case <-o.rdl.wait():
		return 0, c.opError("read", os.ErrDeadlineExceeded)
	default:
	}
	var ready <-chan struct{} // nil: no carrier to take from here
	if o.ready != nil {
		ready = o.ready.DatagramReady()
	}
	for {
		if o.ready != nil {
			if d, ok := o.ready.TakeDatagram(); ok {
				return copy(b, d), nil
			}
		}
		select {
		case it := <-o.in:
			if it.err != nil {
				if it.final {
					c.rerr = it.err
				}
				return 0, it.err
			}
			return copy(b, it.d), nil
		case <-ready:
			// A datagram may wait (or the carrier closed: then none
			// will, and the stream says how the session ends).
		case <-o.done:
			return 0, c.opError("read", net.ErrClosed)
		case <-o.rdl.wait():
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
	}
}

// send sends b on the carrier, if it fits there, and reports whether
// it went.
func (o *over) send(b []byte) bool {
	if int64(len(b)) > o.max.Load() {
		m := int64(o.carrier.MaxDatagram())
		o.max.Store(m)
		if int64(len(b)) > m {
			return false
		}
	}
	if err := o.carrier.SendDatagram(b); err != nil {
		// Too large after all (the path's packets shrank), or the
		// carrier is gone: the stream takes it, or says what failed.
		o.max.Store(0)
		return false
	}
	return true
}

func (o *over) setReadDeadline(t time.Time) error {
	select {
	case <-o.done:
		return net.ErrClosed
	default:
	}
	o.rdl.set(t)
	return nil
}

func (o *over) close() {
	o.once.Do(func() {
		close(o.done)
		o.cancel()
	})
}

// deadline is a read deadline in user space, as net.Pipe's: wait's
// channel is closed once it passed.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{}
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

// set sets the deadline; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer's func ran: wait for it to close cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

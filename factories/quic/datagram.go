package quic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"

	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// QUIC datagrams (RFC 9221). Both ends enable them; where the peer did
// too, each stream carries datagrams of its own beside its bytes
// (layer.DatagramCarrier), unreliable and unordered: a lost one is lost
// alone. On the wire each DATAGRAM frame's payload is
//
//	stream ID (QUIC varint) | datagram
//
// naming the bidirectional stream it belongs to, which both ends number
// alike. One goroutine per path (demux) reads the connection's
// datagrams and hands each to its stream's queue.

// Bounds of what waits to be read: past them a datagram is dropped and
// counted, as a full socket buffer drops it.
const (
	// datagramQueue is the most datagrams one stream holds unread.
	datagramQueue = 1024
	// datagramBytes is the most bytes all the streams of a path hold.
	datagramBytes = 8 << 20
)

var (
	_ layer.DatagramCarrier = (*conn)(nil)
	_ dgram.ReadyCarrier    = (*conn)(nil)

	// datagramDrops counts the datagrams received and dropped: for a
	// stream that is not open (unknown, or closed), whose queue was
	// full, or malformed.
	datagramDrops atomic.Uint64
)

// DatagramsDropped returns how many QUIC datagrams this process received
// and dropped, in all: for a stream not open here, past a full queue, or
// malformed. For tests and diagnostics.
func DatagramsDropped() uint64 { return datagramDrops.Load() }

// parseDatagram splits a DATAGRAM frame's payload into the stream ID it
// names and the datagram. ok is false when the payload is malformed: no
// whole varint, or the ID of a unidirectional stream (they carry none).
func parseDatagram(b []byte) (id quic.StreamID, d []byte, ok bool) {
	v, n, err := quicvarint.Parse(b)
	if err != nil || v&2 != 0 { // bit 1 set: a unidirectional stream
		return 0, nil, false
	}
	return quic.StreamID(v), b[n:], true
}

// appendDatagram appends the payload of a DATAGRAM frame carrying d for
// stream id.
func appendDatagram(b []byte, id quic.StreamID, d []byte) []byte {
	return append(quicvarint.Append(b, uint64(id)), d...)
}

// A demux hands a path's datagrams to its streams' queues.
type demux struct {
	qc *quic.Conn

	mu     sync.Mutex
	queues map[quic.StreamID]*dqueue
	bytes  int // queued, over all the streams
}

// dqueue is one stream's datagrams, waiting to be read.
type dqueue struct {
	items  [][]byte      // under demux.mu
	closed bool          // under demux.mu
	notify chan struct{} // cap 1: something was queued, or the queue closed
}

// newDemux starts the demux of qc, if both ends enabled datagrams; nil
// otherwise. It ends with the connection.
func newDemux(qc *quic.Conn) *demux {
	s := qc.ConnectionState().SupportsDatagrams
	if !s.Local || !s.Remote {
		return nil
	}
	m := &demux{qc: qc, queues: map[quic.StreamID]*dqueue{}}
	go m.run()
	return m
}

func (m *demux) run() {
	ctx := m.qc.Context()
	for {
		b, err := m.qc.ReceiveDatagram(ctx)
		if err != nil {
			m.closeAll()
			return
		}
		m.dispatch(b)
	}
}

// dispatch queues b's datagram on its stream, or drops it.
func (m *demux) dispatch(b []byte) {
	id, d, ok := parseDatagram(b)
	if !ok {
		datagramDrops.Add(1)
		return
	}
	m.mu.Lock()
	q := m.queues[id]
	if q == nil || q.closed || len(q.items) >= datagramQueue || m.bytes+len(d) > datagramBytes {
		m.mu.Unlock()
		datagramDrops.Add(1)
		return
	}
	q.items = append(q.items, d)
	m.bytes += len(d)
	m.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// register makes stream id's queue.
func (m *demux) register(id quic.StreamID) *dqueue {
	q := &dqueue{notify: make(chan struct{}, 1)}
	m.mu.Lock()
	m.queues[id] = q
	m.mu.Unlock()
	return q
}

// unregister drops stream id's queue and what waits in it; a reader
// waiting on it returns.
func (m *demux) unregister(id quic.StreamID) {
	m.mu.Lock()
	if q := m.queues[id]; q != nil {
		m.close(q)
		delete(m.queues, id)
	}
	m.mu.Unlock()
}

// close closes q, under m.mu.
func (m *demux) close(q *dqueue) {
	for _, d := range q.items {
		m.bytes -= len(d)
	}
	q.items, q.closed = nil, true
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (m *demux) closeAll() {
	m.mu.Lock()
	for _, q := range m.queues {
		m.close(q)
	}
	m.mu.Unlock()
}

// next returns q's first datagram, if one waits, and whether q is closed.
func (m *demux) next(q *dqueue) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(q.items) == 0 {
		return nil, q.closed
	}
	d := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	m.bytes -= len(d)
	return d, false
}

// probe is a datagram larger than any packet: quic-go answers it with
// the largest it takes now, sending nothing.
var probe = make([]byte, 1<<16)

// MaxDatagram is the largest datagram SendDatagram takes now: what a
// packet holds less the frame's overhead and the stream's ID. It grows
// as the path's MTU is discovered (1200 bytes and more); 0 when the
// peer does not take datagrams.
func (c *conn) MaxDatagram() int {
	if c.p.dm == nil || c.dq == nil {
		return 0
	}
	var tl *quic.DatagramTooLargeError
	if err := c.p.qc.SendDatagram(probe); !errors.As(err, &tl) {
		return 0 // the connection ended
	}
	return max(0, int(tl.MaxDatagramPayloadSize)-quicvarint.Len(uint64(c.s.StreamID())))
}

// SendDatagram sends b as one QUIC datagram to the other end of the
// stream; a datagram too large for a packet is layer.ErrDatagramTooLarge.
// It blocks while quic-go's send queue is full (congestion control
// paces it).
func (c *conn) SendDatagram(b []byte) error {
	if c.p.dm == nil || c.dq == nil {
		return c.opError("write", errors.New("quic: the peer takes no datagrams"))
	}
	if c.closed.Load() {
		return c.opError("write", net.ErrClosed)
	}
	c.dmu.Lock()
	c.dbuf = appendDatagram(c.dbuf[:0], c.s.StreamID(), b)
	err := c.p.qc.SendDatagram(c.dbuf) // copies
	c.dmu.Unlock()
	var tl *quic.DatagramTooLargeError
	if errors.As(err, &tl) {
		return c.opError("write", fmt.Errorf("%w (%d bytes, at most %d now)", layer.ErrDatagramTooLarge, len(b), max(0, int(tl.MaxDatagramPayloadSize)-quicvarint.Len(uint64(c.s.StreamID())))))
	}
	if err != nil {
		return c.opError("write", err)
	}
	return nil
}

// TakeDatagram returns a datagram that arrived for the stream and waits,
// if one does (dgram.ReadyCarrier).
func (c *conn) TakeDatagram() ([]byte, bool) {
	if c.p.dm == nil || c.dq == nil {
		return nil, false
	}
	d, _ := c.p.dm.next(c.dq)
	return d, d != nil
}

// DatagramReady receives once a datagram may wait for the stream, or its
// queue closed (dgram.ReadyCarrier); nil, never ready, when the path
// carries no datagrams.
func (c *conn) DatagramReady() <-chan struct{} {
	if c.p.dm == nil || c.dq == nil {
		return nil
	}
	return c.dq.notify
}

// ReceiveDatagram returns the next datagram that arrived for the stream,
// waiting until ctx ends, the stream is closed or its connection ends.
func (c *conn) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	if c.p.dm == nil || c.dq == nil {
		return nil, c.opError("read", errors.New("quic: the peer sends no datagrams"))
	}
	for {
		d, closed := c.p.dm.next(c.dq)
		if d != nil {
			return d, nil
		}
		if closed {
			if err := context.Cause(c.p.qc.Context()); err != nil && !c.closed.Load() {
				return nil, c.opError("read", err)
			}
			return nil, c.opError("read", net.ErrClosed)
		}
		select {
		case <-c.dq.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

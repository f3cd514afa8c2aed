package quic

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"
)

// Read receipts (ALPN vlink/2). quic-go tells no one when a stream's data
// has all been acknowledged, and a process that closes its QUIC
// connections, as it must at exit, drops what is still unacknowledged.
// So each end of a vlink/2 connection opens one unidirectional stream,
// its receipt stream, on which it sends the ID (a QUIC varint) of each
// bidirectional stream it is done reading: read to its FIN, or closed or
// aborted by this end (then it wants no more of it). CloseAll, and a
// closed listener, wait for the receipts of the streams this process
// ended with a FIN, bounded by ExitWait, before closing the connection;
// a dialer's idle path lingers on while one is awaited.

// ExitWait bounds how long CloseAll, and a closed listener's path, waits
// for the peer's receipts of the streams this process closed: a dead
// peer holds a program's exit this long, not its idle timeout.
const ExitWait = 3 * time.Second

const (
	// maxUnsent bounds the receipts waiting for the receipt stream (a
	// peer that does not read it); past it, receipts are dropped, and the
	// peer waits for them at most its ExitWait.
	maxUnsent = 64 << 10
	// maxTracked bounds the streams of a path whose receipt is awaited
	// or arrived early; past it, a stream closed is not waited for.
	maxTracked = 4 * MaxStreams
)

// errBadReceipt is matched by a receipt stream that breaks the protocol.
var errBadReceipt = errors.New("quic: malformed read receipt")

// The states of a tracked stream.
type receiptState uint8

const (
	stOpen      receiptState = iota // not yet closed for writing here
	stPending                       // its FIN sent, its receipt awaited
	stReceipted                     // its receipt came before its FIN
)

// receipts is a vlink/2 path's state: the receipts it awaits, and those
// it owes the peer. A nil *receipts (a vlink/1 path) awaits and sends
// nothing.
type receipts struct {
	qc *quic.Conn

	mu      sync.Mutex
	streams map[quic.StreamID]receiptState // streams open, pending or receipted early
	pending int                            // streams in stPending
	settled chan struct{}                  // closed while pending is 0
	unsent  []byte                         // receipts for the writer
	wake    chan struct{}                  // tells the writer of unsent ones
}

// newReceipts starts the receipt streams of qc, a vlink/2 connection,
// and returns their state; their goroutines end with the connection.
func newReceipts(qc *quic.Conn) *receipts {
	r := &receipts{qc: qc, streams: map[quic.StreamID]receiptState{},
		settled: closedChan, wake: make(chan struct{}, 1)}
	go r.writeLoop()
	go r.readLoop()
	return r
}

// track starts tracking a stream of the path.
func (r *receipts) track(id quic.StreamID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.streams) < maxTracked {
		r.streams[id] = stOpen
	}
}

// finished records that the stream's FIN was sent: its receipt is
// awaited unless it came already.
func (r *receipts) finished(id quic.StreamID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.streams[id]
	switch {
	case !ok:
	case st == stOpen:
		r.streams[id] = stPending
		if r.pending++; r.pending == 1 {
			r.settled = make(chan struct{})
		}
	default:
		delete(r.streams, id)
	}
}

// dropped forgets a stream this side reset: no receipt is awaited.
func (r *receipts) dropped(id quic.StreamID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(id)
}

// forget, under mu, stops tracking a stream.
func (r *receipts) forget(id quic.StreamID) {
	if r.streams[id] == stPending {
		if r.pending--; r.pending == 0 {
			close(r.settled)
		}
	}
	delete(r.streams, id)
}

// got records the peer's receipt of a stream. Streams the path does not
// track (done already, never opened) are ignored, so what a peer sends
// costs no memory.
func (r *receipts) got(id quic.StreamID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch st, ok := r.streams[id]; {
	case !ok:
	case st == stOpen:
		r.streams[id] = stReceipted
	default:
		r.forget(id)
	}
}

// done returns a channel closed while no receipt is awaited.
func (r *receipts) done() <-chan struct{} {
	if r == nil {
		return closedChan
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.settled
}

// send owes the peer the receipt of a stream this side is done reading.
func (r *receipts) send(id quic.StreamID) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if len(r.unsent) < maxUnsent {
		r.unsent = quicvarint.Append(r.unsent, uint64(id))
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// writeLoop sends the receipts owed on the receipt stream, opened with
// the first of them. It gives up when the stream fails: the peer then
// waits at most its ExitWait.
func (r *receipts) writeLoop() {
	var s *quic.SendStream
	var buf []byte
	for {
		select {
		case <-r.wake:
		case <-r.qc.Context().Done():
			return
		}
		r.mu.Lock()
		buf, r.unsent = r.unsent, buf[:0]
		r.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if s == nil {
			var err error
			if s, err = r.qc.OpenUniStream(); err != nil {
				return
			}
		}
		if _, err := s.Write(buf); err != nil {
			return
		}
	}
}

// readLoop reads the peer's receipt streams (one at a time: a peer may
// have one open). A malformed one closes the connection.
func (r *receipts) readLoop() {
	ctx := r.qc.Context()
	for {
		s, err := r.qc.AcceptUniStream(ctx)
		if err != nil {
			return
		}
		err = readReceipts(bufio.NewReaderSize(s, 512), r.got)
		var se *quic.StreamError
		switch {
		case errors.Is(err, errBadReceipt):
			r.qc.CloseWithError(codeBadReceipt, err.Error())
			return
		case errors.As(err, &se):
			// The peer reset its receipt stream: it sends no more
			// receipts there, but may open another.
		case err != nil:
			return // the connection ended
		}
	}
}

// readReceipts decodes a receipt stream: stream IDs as QUIC varints,
// each passed to got, until r ends. It returns nil at an end between
// two receipts, and an error matching errBadReceipt for an end within
// one or the ID of a unidirectional stream (which has no reader to
// receipt it); an error of r's is returned as it is.
func readReceipts(r io.ByteReader, got func(quic.StreamID)) error {
	for {
		b, err := r.ReadByte()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		v := uint64(b & 0x3f)
		for range 1<<(b>>6) - 1 {
			b, err := r.ReadByte()
			if err == io.EOF {
				return fmt.Errorf("%w: the stream ends within a stream ID", errBadReceipt)
			}
			if err != nil {
				return err
			}
			v = v<<8 | uint64(b)
		}
		if v&0x2 != 0 {
			return fmt.Errorf("%w: stream %d is unidirectional", errBadReceipt, v)
		}
		got(quic.StreamID(v))
	}
}

// settle waits until p has every receipt it awaits, its connection
// ended, or the deadline passed.
func (p *path) settle(deadline time.Time) {
	if p.qc == nil {
		return
	}
	ctx, cancel := context.WithDeadline(p.qc.Context(), deadline)
	defer cancel()
	select {
	case <-p.rc.done():
	case <-ctx.Done():
	}
}

package mux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"syscall"
)

// A stream's bytes travel inside smux's frames as records, so that its
// end can be told from an abort: smux has no stream reset, and a stream
// closed with a FIN alone is all a peer sees of one ended cleanly or cut
// by a relay whose other side failed. Each record is a header, the
// payload's length, then the payload; a record of length zero is the end
// record, sent by CloseWrite, or by Close when CloseWrite did not come
// first. A stream whose FIN comes without it was aborted (Abort, a Close
// that cut a Write short), and its reader gets ErrAborted rather than
// io.EOF.
//
// The end record ends the bytes, not the stream: smux's FIN goes only
// when the stream closes for good (Close, Abort), as a socket stops
// reading only then, and after an end record the close mark, one byte,
// goes just before it. It tells the peer, whose Read has returned
// io.EOF, that nobody reads the stream here any more: the peer watches
// for it, and its writes then fail with EPIPE, as a TCP write does once
// the peer's reset answers it; after a FIN without the end record they
// fail with ECONNRESET. Without the mark the peer would write on into a
// window that nobody reading opens again: smux's FIN ends the peer's
// reading, not its writing. A FIN after the end record without the mark
// says nothing of the peer's reader: peers from before the mark (the
// same wire version) sent it with the end record, at CloseWrite, and
// never the mark.
//
// Every length is valid, so a record cannot be malformed, only cut
// short; any byte after the end record is the close mark, and what
// follows the mark is read and dropped.
const (
	headerSize = 2          // big-endian payload length
	maxPayload = 1<<16 - 1  // the most a header can announce
	endRecord  = "\x00\x00" // a record with no payload: the end
	closeMark  = "\x00"     // after the end record: nobody reads any more
	chunkData  = chunkSize - headerSize
)

// A Write puts each chunk's data in one record: it must fit (this
// constant overflows, failing the build, if it does not).
const _ uint16 = maxPayload - chunkData

// ErrAborted is matched by the error of a read from a stream that the
// peer ended without its end record: a relay on the other side aborted
// it (its own other side failed), or the peer closed it in the middle of
// a Write. It also matches io.ErrUnexpectedEOF.
//
// It is matched too by the error of a write to a stream that the peer has
// closed for good, so that nobody reads it there any more: with
// syscall.EPIPE after the peer's end record (the peer's Close or Abort
// after its CloseWrite, or its Close), with syscall.ECONNRESET after an
// abort without it, as a TCP write fails once the peer's reset answers
// it (netconn.ResetByPeer takes both for a reset).
var ErrAborted = errors.New("mux stream aborted by the peer")

var (
	errNoEnd      = fmt.Errorf("%w (it ended without its end record): %w", ErrAborted, io.ErrUnexpectedEOF)
	errPeerClosed = fmt.Errorf("%w (it closed the stream after its end: nobody reads it there): %w", ErrAborted, syscall.EPIPE)
	errPeerReset  = fmt.Errorf("%w (it ended without its end record): %w", ErrAborted, syscall.ECONNRESET)
)

// records is a reader's place among the peer's records.
type records struct {
	rem    int              // payload bytes left in the current record
	hdr    [headerSize]byte // the next header, as far as it came
	hdrN   int              // bytes of hdr filled
	ended  bool             // the end record came: only the close mark follows
	marked bool             // a byte came after the end record: the close mark
}

// headerRoom is where the next header's missing bytes go. Only valid
// between records (rem == 0, not ended).
func (r *records) headerRoom() []byte { return r.hdr[r.hdrN:] }

// gotHeader counts n more bytes of the header; with the whole header, the
// record begins.
func (r *records) gotHeader(n int) {
	r.hdrN += n
	if r.hdrN == headerSize {
		r.hdrN = 0
		r.rem = int(binary.BigEndian.Uint16(r.hdr[:]))
		r.ended = r.rem == 0
	}
}

// scan takes the front of b: it returns the payload bytes there (none if b
// starts with header bytes, which it consumes) and the rest of b. Once
// the end record has come it consumes all of b, which is the close mark
// if it holds a byte.
func (r *records) scan(b []byte) (payload, rest []byte) {
	switch {
	case r.ended:
		r.marked = r.marked || len(b) > 0
		return nil, nil
	case r.rem == 0:
		n := copy(r.headerRoom(), b)
		r.gotHeader(n)
		return nil, b[n:]
	}
	n := min(r.rem, len(b))
	r.rem -= n
	return b[:n], b[n:]
}

// putHeader writes the header of a record of n payload bytes.
func putHeader(b []byte, n int) { binary.BigEndian.PutUint16(b, uint16(n)) }

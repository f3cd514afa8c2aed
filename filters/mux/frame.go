package mux

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A stream's bytes travel inside smux's frames as records, so that its
// end can be told from an abort: smux has no stream reset, and a stream
// closed with a FIN alone is all a peer sees of one ended cleanly or cut
// by a relay whose other side failed. Each record is a header, the
// payload's length, then the payload; a record of length zero is the end
// record, sent by CloseWrite and Close. A stream whose FIN comes without
// it was aborted (Abort, a Close that cut a Write short), and its reader
// gets ErrAborted rather than io.EOF.
//
// Every length is valid, so a record cannot be malformed, only cut
// short; bytes after the end record are never read.
const (
	headerSize = 2          // big-endian payload length
	maxPayload = 1<<16 - 1  // the most a header can announce
	endRecord  = "\x00\x00" // a record with no payload: the end
	chunkData  = chunkSize - headerSize
)

// A Write puts each chunk's data in one record: it must fit (this
// constant overflows, failing the build, if it does not).
const _ uint16 = maxPayload - chunkData

// ErrAborted is matched by the error of a read from a stream that the
// peer ended without its end record: a relay on the other side aborted
// it (its own other side failed), or the peer closed it in the middle of
// a Write. It also matches io.ErrUnexpectedEOF.
var ErrAborted = errors.New("mux stream aborted by the peer")

var errNoEnd = fmt.Errorf("%w (it ended without its end record): %w", ErrAborted, io.ErrUnexpectedEOF)

// records is a reader's place among the peer's records.
type records struct {
	rem   int              // payload bytes left in the current record
	hdr   [headerSize]byte // the next header, as far as it came
	hdrN  int              // bytes of hdr filled
	ended bool             // the end record came: nothing follows
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
// the end record has come it consumes nothing.
func (r *records) scan(b []byte) (payload, rest []byte) {
	switch {
	case r.ended:
		return nil, b
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

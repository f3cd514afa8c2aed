package parallelstreams

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format. Each substream opens, after its own VLink hello, with a
// join header from the dialer naming the session it belongs to:
//
//	join  = version u8 | flags u8 | index u16 | count u16 | max u16 | session id [16]
//
// then carries blocks in both directions:
//
//	block = type u8 | reserved [3] | length u32 | value u64 | payload [length]
//
// A data block's value is its sequence number: the blocks of one direction
// are numbered 0, 1, 2... across all substreams, and the receiver puts them
// back in that order. A fin block is numbered too (it comes after the last
// data block): the writer half-closed. A credit block's value is the total
// number of data bytes the receiver allows the writer to have sent so far;
// it is not numbered, only the largest one counts. Integers are big-endian.
const (
	joinSize   = 24
	headerSize = 16

	version = 1

	// MaxBlock is the largest data block. Writes are split into blocks of
	// at most this size, and a reader never allocates more per block.
	MaxBlock = 256 << 10

	// MaxStreams is the most substreams a session can have.
	MaxStreams = 64

	sessionIDSize = 16
)

// Block types.
const (
	blockData   blockType = 1
	blockFin    blockType = 2
	blockCredit blockType = 3
)

// ErrProtocol is matched by the errors a session reports when its peer
// sends something the protocol does not allow: a malformed join or block
// header, a block out of the window, a sequence number seen twice.
var ErrProtocol = errors.New("parallel streams protocol violation")

type blockType uint8

func (t blockType) String() string {
	switch t {
	case blockData:
		return "data"
	case blockFin:
		return "fin"
	case blockCredit:
		return "credit"
	}
	return fmt.Sprintf("block type %d", uint8(t))
}

type sessionID [sessionIDSize]byte

// join is a decoded join header.
type join struct {
	index, count, max int
	id                sessionID
}

func (j *join) marshal() [joinSize]byte {
	var b [joinSize]byte
	b[0] = version
	binary.BigEndian.PutUint16(b[2:], uint16(j.index))
	binary.BigEndian.PutUint16(b[4:], uint16(j.count))
	binary.BigEndian.PutUint16(b[6:], uint16(j.max))
	copy(b[8:], j.id[:])
	return b
}

// parseJoin decodes and checks a join header.
func parseJoin(b *[joinSize]byte) (join, error) {
	j := join{
		index: int(binary.BigEndian.Uint16(b[2:])),
		count: int(binary.BigEndian.Uint16(b[4:])),
		max:   int(binary.BigEndian.Uint16(b[6:])),
	}
	copy(j.id[:], b[8:])
	switch {
	case b[0] != version:
		return j, fmt.Errorf("%w: join header version %d, this side speaks %d", ErrProtocol, b[0], version)
	case b[1] != 0:
		return j, fmt.Errorf("%w: join header flags %#x", ErrProtocol, b[1])
	case j.count < 1 || j.max < j.count || j.max > MaxStreams:
		return j, fmt.Errorf("%w: join header announces %d substreams (at most %d), want 1..%d", ErrProtocol, j.count, j.max, MaxStreams)
	case j.index >= j.max:
		return j, fmt.Errorf("%w: join header index %d of at most %d", ErrProtocol, j.index, j.max)
	}
	return j, nil
}

// header is a block header as it is on the wire.
type header [headerSize]byte

func (h *header) Type() blockType { return blockType(h[0]) }
func (h *header) Len() int        { return int(binary.BigEndian.Uint32(h[4:])) }
func (h *header) Value() uint64   { return binary.BigEndian.Uint64(h[8:]) }

func (h *header) set(t blockType, length int, value uint64) {
	*h = header{byte(t)}
	binary.BigEndian.PutUint32(h[4:], uint32(length))
	binary.BigEndian.PutUint64(h[8:], value)
}

// check validates a header read from the peer, as far as it can alone.
func (h *header) check() error {
	if h[1] != 0 || h[2] != 0 || h[3] != 0 {
		return fmt.Errorf("%w: reserved bytes %x in a %s block", ErrProtocol, h[1:4], h.Type())
	}
	switch n := h.Len(); h.Type() {
	case blockData:
		if n == 0 || n > MaxBlock {
			return fmt.Errorf("%w: data block of %d bytes (1..%d)", ErrProtocol, n, MaxBlock)
		}
	case blockFin, blockCredit:
		if n != 0 {
			return fmt.Errorf("%w: %s block with a %d-byte payload", ErrProtocol, h.Type(), n)
		}
	default:
		return fmt.Errorf("%w: unknown block type %d", ErrProtocol, h[0])
	}
	return nil
}

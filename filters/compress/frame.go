package compress

import (
	"errors"
	"fmt"
)

// A frame is a fixed header followed by its payload:
//
//	type (1) | raw length (3, big endian) | payload length (3, big endian) | payload
//
// A raw frame carries application bytes as they are, a compressed frame one
// block compressed on its own (no state carries over between frames, so
// either side may drop its codec state between frames), and an end frame,
// with no payload, says the writer shut down its side.
//
// The type byte holds the frame's kind in its low four bits and, for a
// compressed frame, the codec in its high four bits. The fixed layers
// (zstd, s2, deflate, lz4) use codec 0, "this layer's codec", so their
// type bytes are 1, 2 and 3. The auto layer names the codec of every
// compressed frame (codecZstd and the others), so its reader follows the
// writer's choices block by block. A reader accepts only the codecs of its
// own layer (see decoders): a fixed layer refuses a frame naming a codec,
// and the auto layer refuses codec 0.
const (
	headerSize = 7

	// MaxBlock is the most application bytes one frame carries. Larger
	// writes are split. It bounds what a reader allocates per frame.
	MaxBlock = 128 << 10

	maxLen = 1<<24 - 1 // the largest value of a 3-byte length field
)

// MaxBlock must fit the header's length fields.
const _ = uint(maxLen - MaxBlock)

// Frame kinds, the low four bits of the type byte.
const (
	frameRaw        frameType = 1 // payload is the application bytes
	frameCompressed frameType = 2 // payload is one block of the frame's codec
	frameEnd        frameType = 3 // no payload: the writer called CloseWrite
)

// ErrCorrupt is matched by the errors a reader returns for a stream that
// does not decode: a malformed frame header, a length out of bounds, a
// codec the layer does not use, a payload the codec rejects, or one that
// decodes to another size than its header declares.
var ErrCorrupt = errors.New("corrupt compressed stream")

type frameType uint8

// A codecID names a codec in a compressed frame's type byte: 0 for the
// layer's own codec, 1 to 15 for the codecs the auto layer picks from.
type codecID uint8

const maxCodecID = 15

// header is a frame header as it is on the wire.
type header [headerSize]byte

func (h *header) Type() frameType { return frameType(h[0] & 0x0f) }
func (h *header) Codec() codecID  { return codecID(h[0] >> 4) }
func (h *header) RawLen() int     { return int(h[1])<<16 | int(h[2])<<8 | int(h[3]) }
func (h *header) PayloadLen() int { return int(h[4])<<16 | int(h[5])<<8 | int(h[6]) }

func (h *header) set(t frameType, rawLen, payloadLen int) { h.setCodec(t, 0, rawLen, payloadLen) }

func (h *header) setCodec(t frameType, id codecID, rawLen, payloadLen int) {
	h[0] = byte(id)<<4 | byte(t)
	h[1], h[2], h[3] = byte(rawLen>>16), byte(rawLen>>8), byte(rawLen)
	h[4], h[5], h[6] = byte(payloadLen>>16), byte(payloadLen>>8), byte(payloadLen)
}

// decoders maps the codec IDs a layer's reader accepts to their decoders;
// the others are nil. Decoding does not depend on the level, so one table
// serves every level.
type decoders [maxCodecID + 1]blockCodec

// check validates a header read from the peer against the codecs the
// reader accepts. A sender only compresses a block when that makes it
// shorter, so a compressed payload must be shorter than its raw length;
// with raw lengths capped at MaxBlock, no frame asks a reader for more
// than MaxBlock bytes of memory.
func (h *header) check(dec *decoders) error {
	raw, payload := h.RawLen(), h.PayloadLen()
	switch h.Type() {
	case frameRaw:
		if h.Codec() != 0 || raw == 0 || raw > MaxBlock || payload != raw {
			return fmt.Errorf("%w: raw frame (type %#x) of %d bytes with a %d-byte payload (limit %d)", ErrCorrupt, h[0], raw, payload, MaxBlock)
		}
	case frameCompressed:
		if dec[h.Codec()] == nil {
			return fmt.Errorf("%w: compressed frame names codec %d, which this layer does not use", ErrCorrupt, h.Codec())
		}
		if raw == 0 || raw > MaxBlock || payload == 0 || payload >= raw {
			return fmt.Errorf("%w: compressed frame of %d bytes with a %d-byte payload (limit %d)", ErrCorrupt, raw, payload, MaxBlock)
		}
	case frameEnd:
		if h.Codec() != 0 || raw != 0 || payload != 0 {
			return fmt.Errorf("%w: end frame (type %#x) with lengths %d and %d", ErrCorrupt, h[0], raw, payload)
		}
	default:
		return fmt.Errorf("%w: unknown frame type %d", ErrCorrupt, h[0])
	}
	return nil
}

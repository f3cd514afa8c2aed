package noise

import (
	"encoding/binary"
	"errors"
	"fmt"

	flynn "github.com/flynn/noise"
)

// A record is a typed header followed by its body:
//
//	type (1) | length (2, big endian) | body (length bytes)
//
// A handshake record carries a Noise handshake message as the Noise
// library made it. After the handshake every record is a Noise transport
// message, the ciphertext of its plaintext and a 16-byte tag, with the
// header as associated data, so neither its type nor its length can be
// changed unnoticed, and each record is sealed under the next nonce, so
// none can be dropped, replayed or reordered unnoticed. A data record
// carries 1 to MaxPlain application bytes; an end record carries none and
// says the writer shut down its side: a stream that ends without it was
// cut short.
const (
	headerSize = 3
	tagSize    = 16 // the ChaCha20-Poly1305 tag
	dhLen      = 32 // an X25519 public key
	// maxRecord is the largest record body: Noise's bound on a message.
	maxRecord = flynn.MaxMsgLen
	// MaxPlain is the most application bytes one record carries. Larger
	// writes are split.
	MaxPlain = maxRecord - tagSize
	// maxHandshake bounds a handshake record: NNpsk0's and NKpsk0's
	// messages are 48 bytes each, so anything much larger is not ours.
	maxHandshake = 256
)

type recordType uint8

const (
	recHandshake recordType = 1 // a Noise handshake message
	recData      recordType = 2 // application bytes
	recEnd       recordType = 3 // no plaintext: the writer called CloseWrite
)

// ErrAuth is matched by every failure to authenticate: a handshake with a
// peer holding another key, or whose view of the hello differs (someone
// changed it on the way), and a record that does not decrypt (changed,
// replayed, reordered or dropped) or is malformed. The connection's read
// side fails for good on it.
var ErrAuth = errors.New("noise: authentication failed")

// header is a record header as it is on the wire.
type header [headerSize]byte

func (h *header) Type() recordType { return recordType(h[0]) }
func (h *header) Len() int         { return int(binary.BigEndian.Uint16(h[1:])) }

func (h *header) set(t recordType, n int) {
	h[0] = byte(t)
	binary.BigEndian.PutUint16(h[1:], uint16(n))
}

// check validates the header of a record read after the handshake,
// before any of its body is read, so a reader never waits for or buffers
// more than one valid record.
func (h *header) check() error {
	n := h.Len()
	switch h.Type() {
	case recData:
		if n <= tagSize {
			return fmt.Errorf("%w: data record of %d bytes, want %d..%d", ErrAuth, n, tagSize+1, maxRecord)
		}
	case recEnd:
		if n != tagSize {
			return fmt.Errorf("%w: end record of %d bytes, want %d", ErrAuth, n, tagSize)
		}
	default:
		return fmt.Errorf("%w: unexpected record type %d", ErrAuth, h[0])
	}
	return nil
}

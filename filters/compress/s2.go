package compress

import (
	"fmt"

	"github.com/klauspost/compress/s2"
)

// s2Encoders are the encoders for levels 1 to 3. They are stateless.
var s2Encoders = [...]func(dst, src []byte) []byte{1: s2.Encode, 2: s2.EncodeBetter, 3: s2.EncodeBest}

type s2Codec struct{ encode func(dst, src []byte) []byte }

func newS2(level int) blockCodec { return s2Codec{s2Encoders[level]} }

func (c s2Codec) compress(dst, src []byte, limit int) int {
	// dst has room for s2.MaxEncodedLen(MaxBlock), so this never allocates.
	out := c.encode(dst[:cap(dst)], src)
	if len(out) > limit {
		return 0
	}
	return len(out)
}

func (s2Codec) decompress(dst, src []byte) error {
	n, err := s2.DecodedLen(src)
	if err != nil {
		return corrupt(err)
	}
	if n != len(dst) {
		return fmt.Errorf("%w: s2 block announces %d bytes, want %d", ErrCorrupt, n, len(dst))
	}
	if _, err := s2.Decode(dst, src); err != nil {
		return corrupt(err)
	}
	return nil
}

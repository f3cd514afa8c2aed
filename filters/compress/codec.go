package compress

import (
	"fmt"

	"github.com/klauspost/compress/s2"
)

// A blockCodec compresses and decompresses blocks of at most MaxBlock
// bytes, each on its own. Implementations are safe for concurrent use and
// keep nothing per connection: encoders and decoders are shared or pooled,
// so an idle connection costs no codec memory.
type blockCodec interface {
	// compress compresses src into dst and returns the compressed length,
	// or 0 if the result would be longer than limit bytes. dst has room
	// for payloadRoom bytes.
	compress(dst, src []byte, limit int) int
	// decompress decompresses src into dst, whose length is the raw length
	// the frame declares, and fails unless the output fills dst exactly.
	// It never writes past dst nor allocates in proportion to what src
	// claims.
	decompress(dst, src []byte) error
}

// payloadRoom is the room a compressor gets for one block: enough for the
// worst case of every codec on a MaxBlock block, so none of them ever
// reallocates. zstd stores an incompressible block raw behind a frame
// header of at most 18 bytes, a block header of 3 and a checksum of 4.
var payloadRoom = max(s2.MaxEncodedLen(MaxBlock), MaxBlock+18+3+4)

// A codecSpec describes one compression layer.
type codecSpec struct {
	name                         string
	id                           codecID // in the auto layer's frames: never renumber
	summary                      string
	minLevel, defLevel, maxLevel int
	levelDoc                     string
	new                          func(level int) blockCodec
}

var codecSpecs = []codecSpec{
	{
		name: "zstd", id: 1, summary: "Zstandard compression (github.com/klauspost/compress/zstd)",
		minLevel: 1, defLevel: 3, maxLevel: 22,
		levelDoc: "zstd level 1-22, mapped to the encoder's fastest (1-2), default (3-5), better (6-9) and best (10-22) speeds",
		new:      newZstd,
	},
	{
		name: "s2", id: 2, summary: "S2 compression, a faster Snappy (github.com/klauspost/compress/s2)",
		minLevel: 1, defLevel: 1, maxLevel: 3,
		levelDoc: "1 default, 2 better, 3 best",
		new:      newS2,
	},
	{
		name: "deflate", id: 3, summary: "Deflate compression (github.com/klauspost/compress/flate)",
		minLevel: 1, defLevel: 5, maxLevel: 9,
		levelDoc: "deflate level 1 (fastest) to 9 (smallest)",
		new:      newDeflate,
	},
	{
		name: "lz4", id: 4, summary: "LZ4 block compression (github.com/pierrec/lz4/v4)",
		minLevel: 0, defLevel: 0, maxLevel: 9,
		levelDoc: "0 fast; 1-9 high compression (HC) with a growing search depth",
		new:      newLZ4,
	},
}

// fixedDecoders are the fixed layers' decoder tables: each accepts its
// own codec, as codec 0, and no other.
var fixedDecoders = func() map[string]*decoders {
	m := map[string]*decoders{}
	for _, s := range codecSpecs {
		m[s.name] = &decoders{0: s.new(s.defLevel)}
	}
	return m
}()

func lookupCodec(name string) (*codecSpec, error) {
	for i := range codecSpecs {
		if codecSpecs[i].name == name {
			return &codecSpecs[i], nil
		}
	}
	return nil, fmt.Errorf("compress: unknown codec %q (known: zstd, s2, deflate, lz4)", name)
}

// corrupt wraps a codec's own error so that it matches ErrCorrupt.
func corrupt(err error) error { return fmt.Errorf("%w: %w", ErrCorrupt, err) }

package compress

import (
	"fmt"
	"sync"

	"github.com/pierrec/lz4/v4"
)

// lz4HCLevels maps levels 1 to 9 to the HC compressor's search depth.
var lz4HCLevels = [...]lz4.CompressionLevel{
	1: lz4.Level1, 2: lz4.Level2, 3: lz4.Level3, 4: lz4.Level4, 5: lz4.Level5,
	6: lz4.Level6, 7: lz4.Level7, 8: lz4.Level8, 9: lz4.Level9,
}

// Compressors hold hash tables; they are pooled, not kept per connection.
var (
	lz4Fast = sync.Pool{New: func() any { return new(lz4.Compressor) }}
	lz4HC   = sync.Pool{New: func() any { return new(lz4.CompressorHC) }}
)

type lz4Codec struct{ level int }

func newLZ4(level int) blockCodec { return lz4Codec{level} }

func (c lz4Codec) compress(dst, src []byte, limit int) int {
	// Given only limit bytes, the compressor gives up (n == 0 or an error)
	// as soon as the output would not fit: incompressible data costs little.
	var n int
	var err error
	if c.level == 0 {
		z := lz4Fast.Get().(*lz4.Compressor)
		n, err = z.CompressBlock(src, dst[:limit])
		lz4Fast.Put(z)
	} else {
		z := lz4HC.Get().(*lz4.CompressorHC)
		z.Level = lz4HCLevels[c.level]
		n, err = z.CompressBlock(src, dst[:limit])
		lz4HC.Put(z)
	}
	if err != nil {
		return 0
	}
	return n
}

func (lz4Codec) decompress(dst, src []byte) error {
	n, err := lz4.UncompressBlock(src, dst)
	if err != nil {
		return corrupt(err)
	}
	if n != len(dst) {
		return fmt.Errorf("%w: lz4 block decoded to %d bytes, want %d", ErrCorrupt, n, len(dst))
	}
	return nil
}

package compress

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// zstdDecoder is the process's one decoder: DecodeAll is safe for
// concurrent use and needs no per-connection state. It refuses windows
// and outputs larger than a frame can hold, and decodes into the caller's
// buffer only.
var zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
	d, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithDecoderMaxMemory(MaxBlock),
		zstd.WithDecoderMaxWindow(MaxBlock),
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		panic("compress: zstd decoder: " + err.Error()) // the options are constant
	}
	return d
})

// zstdEncoders holds one lazily built encoder per encoder speed, shared by
// every connection: EncodeAll is safe for concurrent use.
var zstdEncoders [5]func() *zstd.Encoder

func init() {
	for l := zstd.SpeedFastest; l <= zstd.SpeedBestCompression; l++ {
		zstdEncoders[l] = sync.OnceValue(func() *zstd.Encoder {
			e, err := zstd.NewWriter(nil,
				zstd.WithEncoderLevel(l),
				zstd.WithWindowSize(MaxBlock),
				// A single segment always records the content size the
				// reader checks, even for blocks under 256 bytes.
				zstd.WithSingleSegment(true),
				zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			)
			if err != nil {
				panic("compress: zstd encoder: " + err.Error()) // the options are constant
			}
			return e
		})
	}
}

type zstdCodec struct{ level zstd.EncoderLevel }

func newZstd(level int) blockCodec { return zstdCodec{zstd.EncoderLevelFromZstd(level)} }

func (c zstdCodec) compress(dst, src []byte, limit int) int {
	// dst has room for the worst case (raw zstd blocks), so EncodeAll
	// never reallocates.
	out := zstdEncoders[c.level]().EncodeAll(src, dst[:0])
	if len(out) > limit {
		return 0
	}
	return len(out)
}

func (zstdCodec) decompress(dst, src []byte) error {
	// Check the frame header before decoding: it must announce exactly the
	// declared size, a window no larger than a block, and no dictionary.
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return corrupt(err)
	}
	switch {
	case h.Skippable || h.DictionaryID != 0:
		return fmt.Errorf("%w: zstd frame is skippable or needs a dictionary", ErrCorrupt)
	case !h.HasFCS || h.FrameContentSize != uint64(len(dst)):
		return fmt.Errorf("%w: zstd frame content size %d (known: %t), want %d", ErrCorrupt, h.FrameContentSize, h.HasFCS, len(dst))
	case !h.SingleSegment && h.WindowSize > MaxBlock:
		return fmt.Errorf("%w: zstd window of %d bytes exceeds %d", ErrCorrupt, h.WindowSize, MaxBlock)
	}
	out, err := zstdDecoder().DecodeAll(src, dst[:0])
	if err != nil {
		return corrupt(err)
	}
	if len(out) != len(dst) || &out[0] != &dst[0] {
		return fmt.Errorf("%w: zstd block decoded to %d bytes, want %d", ErrCorrupt, len(out), len(dst))
	}
	return nil
}

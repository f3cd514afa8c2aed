package compress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/flate"
)

// Deflate writers and readers carry large tables and windows; they are
// pooled (writers per level) and only held while a block is coded.
var (
	deflateWriters [10]sync.Pool // *deflateWriter, by level
	deflateReaders = sync.Pool{New: func() any {
		r := new(deflateReader)
		r.r = flate.NewReader(&r.src)
		return r
	}}
)

type deflateWriter struct {
	w   *flate.Writer
	out limitedBuffer
}

type deflateReader struct {
	r   io.ReadCloser // also a flate.Resetter
	src bytes.Reader
	one [1]byte
}

// errFull stops a deflate writer whose output would not pay off.
var errFull = errors.New("compressed block exceeds its limit")

// limitedBuffer collects a writer's output into a fixed buffer and fails
// once it is full.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(p) > cap(l.b)-len(l.b) {
		return 0, errFull
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

type deflateCodec struct{ level int }

func newDeflate(level int) blockCodec { return deflateCodec{level} }

func (c deflateCodec) compress(dst, src []byte, limit int) int {
	dw, _ := deflateWriters[c.level].Get().(*deflateWriter)
	if dw == nil {
		dw = new(deflateWriter)
		var err error
		if dw.w, err = flate.NewWriter(&dw.out, c.level); err != nil {
			panic("compress: deflate writer: " + err.Error()) // the level was checked
		}
	}
	dw.out.b = dst[:0:limit]
	dw.w.Reset(&dw.out)
	_, err := dw.w.Write(src)
	if err == nil {
		err = dw.w.Close()
	}
	n := len(dw.out.b)
	dw.out.b = nil
	deflateWriters[c.level].Put(dw)
	if err != nil {
		return 0
	}
	return n
}

func (deflateCodec) decompress(dst, src []byte) error {
	dr := deflateReaders.Get().(*deflateReader)
	defer func() {
		dr.src.Reset(nil)
		deflateReaders.Put(dr)
	}()
	dr.src.Reset(src)
	if err := dr.r.(flate.Resetter).Reset(&dr.src, nil); err != nil {
		return corrupt(err)
	}
	// Read exactly the declared size, then insist on the end of the
	// stream: a bomb is cut off one byte past the declared size.
	if _, err := io.ReadFull(dr.r, dst); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return fmt.Errorf("%w: deflate block shorter than %d bytes", ErrCorrupt, len(dst))
		}
		return corrupt(err)
	}
	if n, err := dr.r.Read(dr.one[:]); n != 0 || err != io.EOF {
		if n == 0 && err != nil {
			return corrupt(err)
		}
		return fmt.Errorf("%w: deflate block longer than %d bytes", ErrCorrupt, len(dst))
	}
	if dr.src.Len() != 0 {
		return fmt.Errorf("%w: %d bytes after the deflate block", ErrCorrupt, dr.src.Len())
	}
	return nil
}

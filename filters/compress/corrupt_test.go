package compress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/s2"
	"github.com/pierrec/lz4/v4"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// readBoth reads a stream through both Read and WriteTo and checks they
// agree; it returns what Read gave.
func readBoth(t *testing.T, name string, wire []byte) ([]byte, error) {
	t.Helper()
	codec := mustNew(t, name, defaultLevel(name)).codec
	got, err := io.ReadAll(newConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, name, codec))
	var b bytes.Buffer
	_, err2 := newConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, name, codec).WriteTo(&b)
	if !bytes.Equal(got, b.Bytes()) || (err == nil) != (err2 == nil) {
		t.Errorf("Read gave %d bytes and %v; WriteTo %d bytes and %v", len(got), err, b.Len(), err2)
	}
	return got, err
}

// allocated returns the bytes a call of f allocates once the process's
// shared state is warm: the least of several calls, with the garbage
// collector off throughout. Two things are set up once per process, not
// per stream, and would otherwise land on whichever call comes first:
// the pools (sync.Pool), which a collection between two calls empties,
// and the zstd decoder's GOMAXPROCS block decoders, each of which grows
// its buffers the first time DecodeAll happens to pick it (CI once saw
// 2.1 MB for a 1.4 KB stream that way). Each call must do the same work.
func allocated(f func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	least := uint64(math.MaxUint64)
	for range runtime.GOMAXPROCS(0) + 2 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// compressedFrame returns one compressed frame of src by the codec.
func compressedFrame(t *testing.T, name string, src []byte) []byte {
	t.Helper()
	wire := encode(t, name, defaultLevel(name), src)
	var h header
	copy(h[:], wire)
	if h.Type() != frameCompressed || len(wire) != headerSize+h.PayloadLen() {
		t.Fatalf("%s: %d bytes did not make one compressed frame", name, len(src))
	}
	return wire
}

func withRawLen(f []byte, raw int) []byte {
	f = bytes.Clone(f)
	h := (*header)(f[:headerSize])
	h.set(h.Type(), raw, h.PayloadLen())
	return f
}

func TestCorruptFrames(t *testing.T) {
	text := textCorpus(10000)
	tests := []struct {
		name string
		wire []byte
		want error // nil: a clean end
		got  int   // bytes delivered before the error
	}{
		{"unknown type", frame(9, 10, make([]byte, 10)), ErrCorrupt, 0},
		{"raw over MaxBlock", frame(frameRaw, MaxBlock+1, make([]byte, MaxBlock+1)), ErrCorrupt, 0},
		{"raw lengths differ", frame(frameRaw, 10, make([]byte, 11)), ErrCorrupt, 0},
		{"raw empty", frame(frameRaw, 0, nil), ErrCorrupt, 0},
		{"compressed not shorter", frame(frameCompressed, 10, make([]byte, 10)), ErrCorrupt, 0},
		{"compressed empty", frame(frameCompressed, 0, nil), ErrCorrupt, 0},
		{"compressed no payload", frame(frameCompressed, 10, nil), ErrCorrupt, 0},
		{"compressed over MaxBlock", frame(frameCompressed, MaxBlock+1, make([]byte, 100)), ErrCorrupt, 0},
		{"huge lengths", []byte{byte(frameCompressed), 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, ErrCorrupt, 0},
		{"end with payload", frame(frameEnd, 0, []byte{1}), ErrCorrupt, 0},
		{"end with raw length", frame(frameEnd, 5, nil), ErrCorrupt, 0},
		{"error after good frame", append(frame(frameRaw, 3, []byte("abc")), 0), io.ErrUnexpectedEOF, 3},
		{"truncated header", frame(frameRaw, 3, []byte("abc"))[:4], io.ErrUnexpectedEOF, 0},
		{"truncated raw payload", frame(frameRaw, 3, []byte("abc"))[:9], io.ErrUnexpectedEOF, 2},
		{"truncated compressed payload", frame(frameCompressed, 100, make([]byte, 50))[:30], io.ErrUnexpectedEOF, 0},
		{"no end frame", frame(frameRaw, 3, []byte("abc")), io.ErrUnexpectedEOF, 3},
		{"end frame", append(frame(frameRaw, 3, []byte("abc")), frame(frameEnd, 0, nil)...), nil, 3},
		{"bytes after end frame", append(frame(frameEnd, 0, nil), 1, 2, 3), nil, 0},
		{"empty stream", nil, io.ErrUnexpectedEOF, 0},
		{"end frame alone", frame(frameEnd, 0, nil), nil, 0},
	}
	for _, name := range codecNames {
		good := compressedFrame(t, name, text)
		n := len(good) - headerSize
		tests = append(tests, []struct {
			name string
			wire []byte
			want error
			got  int
		}{
			{name + " declared length +1", withRawLen(good, len(text)+1), ErrCorrupt, 0},
			{name + " declared length -1", withRawLen(good, len(text)-1), ErrCorrupt, 0},
			{name + " payload truncated", frame(frameCompressed, len(text), good[headerSize:len(good)-1]), ErrCorrupt, 0},
			{name + " payload garbage", frame(frameCompressed, len(text), bytes.Repeat([]byte{0xff}, n)), ErrCorrupt, 0},
			{name + " payload zeros", frame(frameCompressed, len(text), make([]byte, n)), ErrCorrupt, 0},
			{name + " good", ended(good), nil, len(text)},
			{name + " good, no end frame", good, io.ErrUnexpectedEOF, len(text)},
		}...)
	}
	for _, tc := range tests {
		for _, name := range codecNames {
			if i := bytes.IndexByte([]byte(tc.name), ' '); i > 0 && tc.name[:i] != name && isCodec(tc.name[:i]) {
				continue
			}
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				got, err := readBoth(t, name, tc.wire)
				if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Fatalf("error %v, want %v", err, tc.want)
				}
				if len(got) != tc.got {
					t.Errorf("delivered %d bytes before the error, want %d", len(got), tc.got)
				}
				if tc.want != nil {
					var oe *net.OpError
					if !errors.As(err, &oe) || oe.Net != name || oe.Op != "read" {
						t.Errorf("error %v is not a *net.OpError naming %s", err, name)
					}
				}
			})
			if !isCodec(tc.name[:max(0, bytes.IndexByte([]byte(tc.name), ' '))]) {
				break // codec-independent: one codec is enough
			}
		}
	}
}

func isCodec(s string) bool {
	_, err := lookupCodec(s)
	return err == nil
}

// zstdFrame builds a zstd frame by hand: a header with the given
// descriptor bytes and one RLE block of size n.
func zstdFrame(desc []byte, n int) []byte {
	f := []byte{0x28, 0xb5, 0x2f, 0xfd}
	f = append(f, desc...)
	bh := uint32(n)<<3 | 1<<1 | 1 // last block, RLE
	return append(f, byte(bh), byte(bh>>8), byte(bh>>16), 'A')
}

// A bomb is a compressed payload that claims or expands to far more than
// its frame's raw length.
type bomb struct {
	codec, name string
	raw         int
	payload     []byte
}

func bombs(t *testing.T) []bomb {
	zeros := make([]byte, 8<<20)
	deflated := func() []byte {
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, 9)
		w.Write(zeros)
		w.Close()
		return b.Bytes()
	}()
	lz4ed := func() []byte {
		dst := make([]byte, lz4.CompressBlockBound(len(zeros)))
		n, err := new(lz4.Compressor).CompressBlock(zeros, dst)
		if err != nil {
			t.Fatal(err)
		}
		return dst[:n]
	}()
	fcs := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	return []bomb{
		// Frame header descriptors: 0x40 two-byte content size (+256) and a
		// window byte; 0x60 the same in a single segment; 0xe0 an
		// eight-byte content size in a single segment; 0x00 no content
		// size. 1000 is 0x02e8+256.
		{"zstd", "window 1 GiB", 1000, zstdFrame([]byte{0x40, 20 << 3, 0xe8, 0x02}, 1000)},
		{"zstd", "content size 1 TiB", 1000, zstdFrame(append([]byte{0xe0}, fcs(1<<40)...), 1000)},
		{"zstd", "no content size", 1000, zstdFrame([]byte{0x00, 0}, 1000)},
		{"zstd", "block larger than content size", 1000, zstdFrame([]byte{0x60, 0xe8, 0x02}, 100000)},
		{"zstd", "two frames", 1000, append(zstdFrame([]byte{0x60, 0xe8, 0x02}, 1000), zstdFrame([]byte{0x60, 0xe8, 0x02}, 1000)...)},
		{"deflate", "8 MiB of zeros", MaxBlock, deflated},
		{"lz4", "8 MiB of zeros", MaxBlock, lz4ed},
		{"s2", "8 MiB of zeros", MaxBlock, s2.Encode(nil, zeros)},
		{"s2", "length varint 4 GiB", MaxBlock, append(binary.AppendUvarint(nil, 1<<32-1), make([]byte, 100)...)},
	}
}

// TestBombs feeds frames that claim or expand to far more than MaxBlock:
// each must fail with ErrCorrupt having allocated next to nothing, in
// the fixed layer of its codec and in auto, with the frame naming the
// codec.
func TestBombs(t *testing.T) {
	a := mustAuto(t, AutoConfig{Codecs: codecNames})
	for _, tc := range bombs(t) {
		if len(tc.payload) >= tc.raw {
			t.Fatalf("%s/%s: payload of %d bytes for %d: not a bomb", tc.codec, tc.name, len(tc.payload), tc.raw)
		}
		s, _ := lookupCodec(tc.codec)
		for _, layer := range []string{tc.codec, "adaptive"} {
			t.Run(layer+"/"+tc.codec+"/"+tc.name, func(t *testing.T) {
				wire := frame(frameCompressed, tc.raw, tc.payload)
				newReader := func() *conn {
					return newConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, tc.codec, mustNew(t, tc.codec, defaultLevel(tc.codec)).codec)
				}
				if layer == "adaptive" {
					wire = withType(wire, byte(s.id)<<4|byte(frameCompressed))
					newReader = func() *conn { return newAutoConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, a) }
				}
				var err error
				alloc := allocated(func() { _, err = io.ReadAll(newReader()) })
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v, want ErrCorrupt", err)
				}
				t.Logf("%v; %d bytes allocated", err, alloc)
				if alloc > 256<<10 && !raceEnabled {
					t.Errorf("%d bytes allocated", alloc)
				}
			})
		}
	}
}

// TestZstdHandMadeFrames checks the hand-made zstd frames above are
// otherwise well formed: with honest sizes they decode.
func TestZstdHandMadeFrames(t *testing.T) {
	for _, tc := range []struct {
		desc []byte
		n    int
	}{{[]byte{0x20, 200}, 200}, {[]byte{0x60, 0xe8, 0x02}, 1000}, {[]byte{0x40, 6 << 3, 0xe8, 0x02}, 1000}} {
		desc, n := tc.desc, tc.n
		got, err := readBoth(t, "zstd", ended(frame(frameCompressed, n, zstdFrame(desc, n))))
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte("A"), n)) {
			t.Fatalf("desc %x: %d bytes, %v", desc, len(got), err)
		}
	}
}

package compress

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
)

func FuzzZstd(f *testing.F)    { fuzzDecoder(f, "zstd") }
func FuzzS2(f *testing.F)      { fuzzDecoder(f, "s2") }
func FuzzDeflate(f *testing.F) { fuzzDecoder(f, "deflate") }
func FuzzLZ4(f *testing.F)     { fuzzDecoder(f, "lz4") }

// FuzzAuto feeds arbitrary bytes to an auto reader that accepts every
// codec, as a stream and as the payload of one compressed frame naming a
// codec picked by the input (0 to 15, so unknown codecs are covered).
func FuzzAuto(f *testing.F) {
	a := mustAuto(f, AutoConfig{Codecs: codecNames, MaxLevel: 22})
	text, random := textCorpus(5000), testnet.RandomBytes(3000, 7)
	for j := range a.rungs {
		f.Add(ended(encodeAuto(f, a, j, text)))
		f.Add(encodeAuto(f, a, j, text[:100], random, text[:70], text[100:]))
	}
	f.Add([]byte{})
	f.Add(frame(frameEnd, 0, nil))
	f.Add(withType(frame(frameCompressed, MaxBlock, make([]byte, 100)), 0x12))
	wire := encodeAuto(f, a, 3, text)
	f.Add(wire[headerSize:])
	f.Add(wire[:len(wire)/2])
	fuzzStreams(f, "adaptive", func(wire []byte) *conn { return newAutoConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, a) },
		func(data []byte) byte { return data[0]&0xf0 | byte(frameCompressed) })
}

// fuzzDecoder feeds arbitrary bytes to a reader, both as a stream and as
// the payload of one compressed frame (so that the codec's decoder sees
// every input). It must never panic, must fail only with ErrCorrupt or
// io.ErrUnexpectedEOF, must give the same bytes through Read and WriteTo,
// and must allocate a bounded amount whatever the input claims.
func fuzzDecoder(f *testing.F, name string) {
	s, _ := lookupCodec(name)
	text, random := textCorpus(5000), testnet.RandomBytes(3000, 7)
	for _, level := range []int{s.minLevel, s.defLevel, s.maxLevel} {
		f.Add(ended(encode(f, name, level, text)))
		f.Add(encode(f, name, level, text[:100], random, text[:70], text[100:]))
	}
	f.Add([]byte{})
	f.Add(frame(frameEnd, 0, nil))
	f.Add(frame(frameRaw, 5, []byte("hello")))
	f.Add(frame(frameCompressed, MaxBlock, make([]byte, 100)))
	wire := encode(f, name, s.defLevel, text)
	f.Add(wire[headerSize:]) // a bare payload
	f.Add(wire[:len(wire)/2])
	codec := mustNew(f, name, s.defLevel).codec
	fuzzStreams(f, name, func(wire []byte) *conn { return newConn(&testnet.FakeConn{R: bytes.NewReader(wire)}, name, codec) },
		func([]byte) byte { return byte(frameCompressed) })
}

// fuzzStreams runs the fuzz target over readers from newReader: each
// input as a stream, and as the payload of a compressed frame whose type
// byte typ picks from the input.
func fuzzStreams(f *testing.F, name string, newReader func([]byte) *conn, typ func([]byte) byte) {
	buf := make([]byte, 4096)
	f.Fuzz(func(t *testing.T, data []byte) {
		streams := [][]byte{data}
		if len(data) > 2 {
			// data[:2] picks a raw length, the rest is the payload.
			raw := len(data) - 2 + 1 + (int(data[0])<<8|int(data[1]))*4%MaxBlock
			streams = append(streams, withType(frame(frameCompressed, min(raw, MaxBlock), data[2:]), typ(data)))
		}
		for _, wire := range streams {
			var sumRead, sumTo [sha256.Size]byte
			var nRead, nTo int64
			var errRead, errTo error
			alloc := allocated(func() {
				h := sha256.New()
				nRead, errRead = io.CopyBuffer(h, struct{ io.Reader }{newReader(wire)}, buf)
				h.Sum(sumRead[:0])
				h.Reset()
				nTo, errTo = newReader(wire).WriteTo(h)
				h.Sum(sumTo[:0])
			})
			for _, err := range []error{errRead, errTo} {
				if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error %v", err)
				}
			}
			if nRead != nTo || sumRead != sumTo || (errRead == nil) != (errTo == nil) {
				t.Fatalf("Read gave %d bytes and %v, WriteTo %d and %v", nRead, errRead, nTo, errTo)
			}
			// The buffers, a codec's pooled state and the hashes: a few
			// MaxBlocks at most, never what a frame claims.
			if alloc > 2<<20 && !raceEnabled {
				t.Fatalf("%s: %d bytes allocated for a %d-byte stream", name, alloc, len(wire))
			}
		}
	})
}

// TestFuzzSeedsDecode makes sure the seeds reach the decoders: the valid
// ones decode.
func TestFuzzSeedsDecode(t *testing.T) {
	text := textCorpus(5000)
	for _, name := range codecNames {
		got, err := readBoth(t, name, ended(encode(t, name, defaultLevel(name), text)))
		if err != nil || !bytes.Equal(got, text) {
			t.Fatalf("%s: %d bytes, %v", name, len(got), err)
		}
	}
}

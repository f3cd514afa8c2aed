package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"
)

func FuzzCtl(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 5})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := bytes.NewReader(raw)
		for {
			m, err := readCtl(r)
			if err != nil {
				return
			}
			if m.op != opFin && (m.op != opRst || m.n != 0) {
				t.Fatalf("accepted %+v", m)
			}
			var b bytes.Buffer
			writeCtl(&b, m)
			if b.Len() != ctlSize {
				t.Fatalf("%+v encodes to %d bytes", m, b.Len())
			}
		}
	})
}

func FuzzHello(f *testing.F) {
	f.Add(encodeHello(DefaultRingSize))
	f.Add(encodeHello(3000))
	f.Fuzz(func(t *testing.T, raw []byte) {
		size, err := decodeHello(raw)
		if err != nil {
			if !errors.Is(err, errProtocol) {
				t.Fatalf("an error that is not errProtocol: %v", err)
			}
			return
		}
		if !validSize(size) || !bytes.Equal(encodeHello(size), raw) {
			t.Fatalf("accepted a ring of %d from %x", size, raw)
		}
	})
}

// FuzzRing runs a consumer and a producer against a peer that writes
// whatever the fuzzer says into the ring's shared words: they may fail
// with errCorrupt, but never read or write outside the ring (the
// slices would panic), and what they take from the ring is only ever
// within what the peer published.
func FuzzRing(f *testing.F) {
	f.Add([]byte{0, 10, 1, 5, 0, 200, 3, 255})
	f.Fuzz(func(t *testing.T, script []byte) {
		const size = minRingSize
		mem := make([]uint64, (ringHeader+size)/8) // 8-byte aligned
		b := unsafe.Slice((*byte)(unsafe.Pointer(&mem[0])), ringHeader+size)
		cons, prod := newRing(b, size), newRing(b, size)
		buf := make([]byte, 3*size)
		for len(script) >= 2 {
			op, arg := script[0], uint64(script[1])
			script = script[2:]
			switch op % 6 {
			case 0: // the peer moves tail anywhere
				atomic.StoreUint64(cons.tail, cons.mine+arg*97-1000)
			case 1: // the peer moves head anywhere
				atomic.StoreUint64(prod.head, prod.mine+arg*97-1000)
			case 2:
				n, err := cons.readable()
				if err != nil {
					if !errors.Is(err, errCorrupt) {
						t.Fatal(err)
					}
					continue
				}
				cons.get(buf[:min(int(arg)*64, len(buf))], n)
			case 3:
				n, err := prod.writable()
				if err != nil {
					if !errors.Is(err, errCorrupt) {
						t.Fatal(err)
					}
					continue
				}
				prod.put(buf[:min(int(arg)*64, len(buf))], n)
			case 4: // the peer scribbles on the header
				binary.LittleEndian.PutUint64(b[int(arg)%ringHeader&^7:], uint64(arg)<<56|uint64(arg))
			case 5: // an honest peer publishes what it wrote
				atomic.StoreUint64(cons.tail, prod.mine)
				atomic.StoreUint64(prod.head, cons.mine)
			}
			if n, err := cons.readable(); err == nil && n > size {
				t.Fatalf("readable %d bytes in a ring of %d", n, size)
			}
		}
	})
}

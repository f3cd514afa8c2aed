package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// A ring is one direction of a connection: a byte ring in memory both
// processes map, written by one (the producer) and read by the other
// (the consumer). The producer owns tail, the consumer head; each keeps
// its own copy and only publishes it, so a peer that scribbles on the
// shared words can corrupt what it sends, never make this side read or
// write outside the ring: every value read from the peer is checked.
//
// Layout, at the ring's offset in the mapping (each word on a cache line
// of its own, so the two sides do not contend for one):
//
//	tail    u64  bytes written so far (producer)
//	head    u64  bytes read so far (consumer)
//	wantData u32 the consumer sleeps until tail moves (consumer)
//	wantRoom u32 the producer sleeps until head moves (producer)
//	data    [size]byte
const (
	lineSize     = 64
	offTail      = 0
	offHead      = lineSize
	offWantData  = 2 * lineSize
	offWantRoom  = 3 * lineSize
	ringHeader   = 4 * lineSize
	minRingSize  = 4 << 10
	maxRingSize  = 64 << 20
	defaultRings = 1 << 20
)

// Sleeping without a lost wake-up is Dekker's protocol: a sleeper
// raises its flag (wantData, wantRoom) and then looks at the ring; the
// other side moves the ring (tail, head) and then looks at the flag, and
// rings the bell if it is up. Either the sleeper sees the move or the
// mover sees the flag, but only if neither side's load can pass its own
// store. Go's atomic stores promise that, yet under the race detector,
// on memory outside Go's heap such as this mapping, they are plain
// stores that a later load may pass: on a mapping, both sides missed in
// 2% of a million rounds, and a transfer slept forever (TestNoLostWakeup
// checks it). So the two stores are swaps, a full barrier on every
// platform, and the same XCHG as an atomic store on amd64.

// publish stores this side's position (tail or head) for the peer.
func publish(p *uint64, v uint64) { atomic.SwapUint64(p, v) }

// raise puts up a sleeper's flag, saying how it sleeps (wait.go).
func raise(flag *uint32, how uint32) { atomic.SwapUint32(flag, how) }

// errCorrupt: the peer wrote values into the ring's header that no
// correct peer writes.
var errCorrupt = errors.New("shm: the peer corrupted the ring")

type ring struct {
	tail, head         *uint64
	wantData, wantRoom *uint32
	data               []byte
	size               uint64 // a power of two
	mine               uint64 // this side's tail (producer) or head (consumer)
}

// newRing lays a ring of size bytes (a power of two) over mem, which
// holds ringHeader+size bytes and is 8-byte aligned.
func newRing(mem []byte, size int) *ring {
	return &ring{
		tail:     (*uint64)(unsafe.Pointer(&mem[offTail])),
		head:     (*uint64)(unsafe.Pointer(&mem[offHead])),
		wantData: (*uint32)(unsafe.Pointer(&mem[offWantData])),
		wantRoom: (*uint32)(unsafe.Pointer(&mem[offWantRoom])),
		data:     mem[ringHeader : ringHeader+size : ringHeader+size],
		size:     uint64(size),
	}
}

// validSize reports whether size can be a ring's.
func validSize(size int) bool {
	return size >= minRingSize && size <= maxRingSize && size&(size-1) == 0
}

// readable returns how many bytes the consumer can read: the peer's
// tail, checked against this side's head.
func (r *ring) readable() (uint64, error) {
	n := atomic.LoadUint64(r.tail) - r.mine
	if n > r.size { // also a tail behind head, which wraps to a huge n
		return 0, fmt.Errorf("%w: %d bytes in a ring of %d", errCorrupt, int64(n), r.size)
	}
	return n, nil
}

// writable returns how many bytes the producer can write: the room the
// peer's head leaves, checked against this side's tail.
func (r *ring) writable() (uint64, error) {
	used := r.mine - atomic.LoadUint64(r.head)
	if used > r.size {
		return 0, fmt.Errorf("%w: the peer read %d bytes it was not sent", errCorrupt, -int64(used))
	}
	return r.size - used, nil
}

// put copies up to n bytes of p into the ring and publishes them; n is
// what writable returned.
func (r *ring) put(p []byte, n uint64) int {
	n = min(n, uint64(len(p)))
	at := r.mine & (r.size - 1)
	c := copy(r.data[at:], p[:n])
	copy(r.data, p[c:n])
	r.mine += n
	publish(r.tail, r.mine)
	return int(n)
}

// get copies up to n bytes out of the ring into p and publishes the
// room; n is what readable returned.
func (r *ring) get(p []byte, n uint64) int {
	n = min(n, uint64(len(p)))
	at := r.mine & (r.size - 1)
	c := copy(p[:n], r.data[at:])
	copy(p[c:n], r.data)
	r.mine += n
	publish(r.head, r.mine)
	return int(n)
}

// region returns the ring's next contiguous stretch, of at most n bytes,
// from this side's position: to fill (the producer, then wrote) or to
// drain (the consumer, then read).
func (r *ring) region(n uint64) []byte {
	at := r.mine & (r.size - 1)
	return r.data[at : at+min(n, r.size-at)]
}

// wrote publishes n more bytes of region filled (producer).
func (r *ring) wrote(n uint64) {
	r.mine += n
	publish(r.tail, r.mine)
}

// read publishes n more bytes of region drained (consumer).
func (r *ring) read(n uint64) {
	r.mine += n
	publish(r.head, r.mine)
}

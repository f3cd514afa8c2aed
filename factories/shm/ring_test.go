//go:build linux

package shm

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNoLostWakeup runs the doorbell's handshake (ring.go) many times
// with both sides at once, on a mapping as a connection's rings are:
// the producer publishes a chunk and then looks at the consumer's flag,
// the consumer raises its flag and then looks at the ring. In no round
// may both miss, or the consumer would sleep on a bell nobody rings.
// With plain atomic stores this fails under the race detector, whose
// stores outside Go's heap a later load may pass.
func TestNoLostWakeup(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	mem, err := unix.Mmap(-1, 0, mappingSize(minRingSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	prod, cons := newRing(mem, minRingSize), newRing(mem, minRingSize)
	rounds := 200000
	if testing.Short() {
		rounds = 20000
	}
	var arrive atomic.Int64
	// meet returns once both sides have called it the nth time, and
	// then waits a few loads more, so that the two sides' order varies.
	meet := func(n int64, r *rand.Rand) {
		arrive.Add(1)
		for arrive.Load() < 2*n {
		}
		for range r.IntN(8) {
			arrive.Load()
		}
	}
	// Each side stores to lines the other reads just before its store
	// under test (a chunk into the ring, a copy into scratch), as writes
	// and reads do: those stores drain slowly, which widens the window a
	// plain store leaves from a few rounds in 200,000 to hundreds.
	chunk, got := make([]byte, 1024), make([]byte, 1024)
	scratch := mem[2*ringHeader+minRingSize:][:1024]
	prodMissed := make([]bool, rounds)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(1, 2))
		for i := range rounds {
			meet(int64(2*i+1), r)
			copy(chunk, scratch)
			prod.put(chunk, uint64(len(chunk)))
			prodMissed[i] = atomic.LoadUint32(prod.wantData) == 0
			meet(int64(2*i+2), r)
		}
	}()
	both := 0
	r := rand.New(rand.NewPCG(3, 4))
	for i := range rounds {
		meet(int64(2*i+1), r)
		copy(scratch, got)
		raise(cons.wantData, wantBell)
		n, _ := cons.readable()
		consMissed := n == 0
		meet(int64(2*i+2), r) // the producer is done with round i
		if consMissed && prodMissed[i] {
			both++
		}
		if n, err := cons.readable(); (n != uint64(len(chunk)) || cons.get(got, n) != len(chunk)) && !t.Failed() {
			t.Errorf("round %d: the ring holds %d bytes (%v), want %d", i, n, err, len(chunk))
		}
		atomic.StoreUint32(cons.wantData, 0)
	}
	<-done
	if both > 0 {
		t.Fatalf("in %d of %d rounds neither side saw the other: the consumer would sleep through the producer's chunk", both, rounds)
	}
}

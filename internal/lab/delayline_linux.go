package lab

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A delayLine forwards packets between two TUN devices, one in each
// host, holding each for its direction's delay. It runs as four
// goroutines of the lab's process (a reader and a writer per direction),
// so it lives exactly as long as its owner: when the process ends, the
// TUN descriptors close and the kernel removes both devices.
type delayLine struct {
	a, b   *os.File
	ab, ba *pipe
	wg     sync.WaitGroup
	once   sync.Once
}

func newDelayLine(a, b *os.File, ab, ba Shape, seed uint64) *delayLine {
	d := &delayLine{a: a, b: b}
	d.ab = newPipe(a, b, ab, seed)
	d.ba = newPipe(b, a, ba, seed^0x9e3779b97f4a7c15)
	for _, p := range []*pipe{d.ab, d.ba} {
		d.wg.Add(2)
		go func() { defer d.wg.Done(); p.readLoop() }()
		go func() { defer d.wg.Done(); p.writeLoop() }()
	}
	return d
}

// close stops the line and waits for its goroutines; the TUN devices
// vanish with their descriptors.
func (d *delayLine) close() {
	d.once.Do(func() {
		d.ab.stop()
		d.ba.stop()
		d.a.Close()
		d.b.Close()
		d.wg.Wait()
	})
}

// A pipe is one direction: it reads packets from in, stamps each with the
// time it is due, and a writer sends them to out at that time, in order.
// The packets wait in a byte ring (one copy, by the read itself, and no
// allocation per packet); their descriptors wait in a channel, which is
// FIFO, so the writer only ever waits for the oldest packet: one timer,
// no sorting.
type pipe struct {
	in, out *os.File
	shape   atomic.Pointer[Shape] // SetLink swaps it; read once per packet
	rng     *rand.Rand

	ring  []byte
	limit uint64        // bytes the ring may hold (Queue)
	w     uint64        // next write position (reader's)
	r     atomic.Uint64 // released up to here (writer's)
	q     chan entry
	done  chan struct{}

	packets, bytes, lost, overflow, sent, writeErrors atomic.Uint64
	writes, late, lateMax                             atomic.Uint64
	lateHist                                          [LateBuckets]atomic.Uint64
}

// An entry is one packet in the ring, due at a monotonic instant.
type entry struct {
	start, end uint64 // ring positions; end also releases padding before start
	due        time.Time
	segs       uint32
}

func newPipe(in, out *os.File, s Shape, seed uint64) *pipe {
	limit := uint64(s.Queue)
	p := &pipe{
		in: in, out: out,
		rng:   rand.New(rand.NewPCG(seed, seed>>1|1)),
		ring:  make([]byte, limit+2*maxPacket),
		limit: limit,
		q:     make(chan entry, 1<<16),
		done:  make(chan struct{}),
	}
	p.shape.Store(&s)
	return p
}

func (p *pipe) stop() { close(p.done) }

func (p *pipe) stats() DirStats {
	s := DirStats{
		Packets: p.packets.Load(), Bytes: p.bytes.Load(), Lost: p.lost.Load(),
		Overflow: p.overflow.Load(), Sent: p.sent.Load(), WriteErrors: p.writeErrors.Load(),
		Writes: p.writes.Load(), Late: time.Duration(p.late.Load()), LateMax: time.Duration(p.lateMax.Load()),
	}
	for k := range p.lateHist {
		s.LateHist[k] = p.lateHist[k].Load()
	}
	return s
}

// reserve returns where in the ring the next packet of at most n bytes
// goes (skipping the ring's tail when it is too short), or ok false if
// the ring is full.
func (p *pipe) reserve(n int) (start uint64, ok bool) {
	size := uint64(len(p.ring))
	start = p.w
	if off := start % size; size-off < uint64(n) {
		start += size - off
	}
	return start, start+uint64(n)-p.r.Load() <= size
}

func (p *pipe) readLoop() {
	defer close(p.q)
	size := uint64(len(p.ring))
	scratch := make([]byte, maxPacket)
	var (
		last  time.Time
		split []byte // runs of kept segments, when loss splits a packet
		runs  []segRun
		drop  []bool // drop[i]: segment i is lost
	)
	for {
		start, ok := p.reserve(maxPacket)
		buf := scratch
		if ok {
			off := start % size
			buf = p.ring[off : off+maxPacket]
		}
		n, err := p.in.Read(buf)
		if err != nil {
			// Closed by stop, or a device error (its namespace went
			// away): nothing more will come either way.
			return
		}
		pkt := buf[:n]
		now := time.Now()
		shape := p.shape.Load()
		segs := 1
		g, gerr := parseGSO(pkt)
		if gerr == nil {
			segs = g.segments()
		}
		p.packets.Add(uint64(segs))
		p.bytes.Add(uint64(n - vnetHdrLen))
		lost := 0
		if shape.Loss > 0 {
			drop = drop[:0]
			for range segs {
				d := p.rng.Float64() < float64(shape.Loss)
				drop = append(drop, d)
				if d {
					lost++
				}
			}
		}
		if lost == segs {
			p.lost.Add(uint64(segs))
			continue
		}
		if !ok || p.w-p.r.Load()+uint64(n) > p.limit {
			p.overflow.Add(uint64(segs))
			continue
		}
		p.lost.Add(uint64(lost))
		due := now.Add(p.delay(shape))
		if due.Before(last) {
			due = last // FIFO: jitter never reorders
		}
		last = due
		if lost == 0 {
			p.push(entry{start: start, end: start + uint64(n), due: due, segs: uint32(segs)})
			continue
		}
		// Some segments of a super-packet are lost: each run of kept
		// segments goes out as a packet of its own. The runs are built
		// aside, then copied into the ring where the original was (a
		// header longer each; the ring keeps room for that).
		split, runs = split[:0], runs[:0]
		for i := 0; i < segs; {
			if drop[i] {
				i++
				continue
			}
			j := i
			for j < segs && !drop[j] {
				j++
			}
			before := len(split)
			split = g.appendSegments(split, i, j)
			runs = append(runs, segRun{len(split) - before, j - i})
			i = j
		}
		start, ok = p.reserve(len(split))
		if !ok || p.w-p.r.Load()+uint64(len(split)) > p.limit {
			p.overflow.Add(uint64(segs - lost))
			continue
		}
		copy(p.ring[start%size:], split)
		for _, r := range runs {
			p.push(entry{start: start, end: start + uint64(r.bytes), due: due, segs: uint32(r.segs)})
			start += uint64(r.bytes)
		}
	}
}

// A segRun is a packet made of consecutive kept segments.
type segRun struct{ bytes, segs int }

// push queues e; p.w moves past it. A full descriptor channel (65536
// packets in flight) counts as overflow.
func (p *pipe) push(e entry) {
	select {
	case p.q <- e:
		p.w = e.end
	default:
		p.overflow.Add(uint64(e.segs))
	}
}

// delay draws one packet's delay: Delay ± Jitter, uniformly.
func (p *pipe) delay(s *Shape) time.Duration {
	d := s.Delay.D()
	if j := s.Jitter.D(); j > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*j)+1)) - j
	}
	return max(d, 0)
}

func (p *pipe) writeLoop() {
	size := uint64(len(p.ring))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for e := range p.q {
		if !p.sleepUntil(e.due, timer) {
			return
		}
		if late := time.Since(e.due); late > 0 {
			p.late.Add(uint64(late))
			if uint64(late) > p.lateMax.Load() {
				p.lateMax.Store(uint64(late)) // one writer: no lost update
			}
			p.lateHist[min(bits.Len64(uint64(late/time.Microsecond)), LateBuckets-1)].Add(1)
		} else {
			p.lateHist[0].Add(1)
		}
		p.writes.Add(1)
		off := e.start % size
		if _, err := p.out.Write(p.ring[off : off+(e.end-e.start)]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			p.writeErrors.Add(uint64(e.segs))
		} else {
			p.sent.Add(uint64(e.segs))
		}
		p.r.Store(e.end)
	}
}

// fineSleep is how close to a packet's due time the writer switches
// from the runtime's timers to nanosleep: the runtime's poller sleeps in
// whole milliseconds (a 300µs wait lasts 1ms), the kernel's
// high-resolution timers to the microsecond.
const fineSleep = 2 * time.Millisecond

// sleepUntil waits until t; false if the pipe stopped meanwhile.
func (p *pipe) sleepUntil(t time.Time, timer *time.Timer) bool {
	for {
		wait := time.Until(t)
		switch {
		case wait <= 0:
			return true
		case wait > fineSleep:
			timer.Reset(wait - fineSleep)
			select {
			case <-timer.C:
			case <-p.done:
				timer.Stop()
				return false
			}
		default:
			ts := unix.NsecToTimespec(int64(wait))
			unix.Nanosleep(&ts, nil) // an early return (EINTR) loops
		}
	}
}

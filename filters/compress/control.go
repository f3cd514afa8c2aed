package compress

import (
	"math"
	"time"
)

// The auto layer's controller: what it does and why, then its tuning.
//
// A fixed codec is a guess: zstd triples a 100 Mbit/s link's goodput on
// text, and divides a loopback connection's by twenty. The auto layer
// (AdOC's idea, adaptive online compression) guesses no more. Its frames
// are the same, except that each compressed frame names its codec, so the
// reader follows whatever the writer chooses, block by block; the level
// only matters to the writer. The writer moves on a ladder of rungs: off,
// then codec-level settings from the fastest to the strongest (by default
// s2-1, s2-2, zstd-1, zstd-6; see [AutoConfig]).
//
// AdOC puts a queue between a compressing thread and a sending thread and
// watches it: when data piles up, the link drains slower than the
// compressor produces, so the CPU has time to spare and a stronger level
// pays; when the queue runs dry, the compressor is the bottleneck and a
// faster level, down to none, pays. Our writer has no queue of its own
// (every Write is on the wire, or in the socket, when it returns): the
// socket's send buffer is the queue. The controller watches it from above:
// the time each Write spends compressing and in the socket and, where the
// kernel tells (tcp_info on Linux), how many bytes wait unsent in the
// socket and how fast the peer acknowledges.
//
// Rather than climb blindly from level to level, it keeps a small model,
// updated every epoch (1 MiB of application bytes and 50 ms, or 100 ms
// spent in Write):
//
//   - the link rate B, in wire bytes per second, measured when the link
//     limits the writer: 256 KiB or more wait unsent in the socket, as
//     tcp_info says, the rate being what the peer acknowledged (without
//     tcp_info: the writer spends a good share of its time in the socket,
//     or it is at off, where the socket is all there is, the rate being
//     what it wrote; a writer starved of CPU looks the same, which is why
//     tcp_info is preferred). Otherwise only a lower bound is known, and
//     the estimate grows, doubling every second spent writing, until the
//     link pushes back: that is how a link that became faster is found;
//   - each rung's compression speed C (application bytes per second of
//     CPU), measured whenever the rung compresses, built-in priors scaled
//     to this machine until then;
//   - the data's compressibility: rung j's ratio is 1 + rho_j*kappa, where
//     kappa follows the data (measured every epoch at the current rung;
//     at off, by a probe block) and rho_j, each rung's strength relative
//     to the others, comes from the priors and is refined by probe blocks.
//
// Compression and transmission overlap (the kernel sends while the writer
// compresses the next block), so rung j's predicted goodput is
// min(C_j, B*R_j), and off's is B. At the end of each epoch the controller
// moves to the best rung of the model: down, to a cheaper rung, as soon as
// one is predicted within 3% of the current one; up only for a predicted
// gain of 10%. The asymmetry is the hysteresis: neither move qualifies an
// immediate move back, and equal predictions (random data, where every
// ratio is 1) settle on the cheapest rung. A move may skip rungs, so a
// cold start or a change of data or link reaches the new best rung in an
// epoch or two.
//
// Epochs in which the application, not the link or the CPU, set the pace
// (the writer spent less than half the time in Write) teach nothing about
// the link; idle time does not age the link estimate either. When
// tcp_info shows the peer's receive window holding the sender back, the
// peer reads slower than the link carries: compressing more would only
// give it more to decode, so every rung is predicted at the peer's pace
// and the cheapest wins. A move down that only the grown estimate
// justified is an exploration, and so is the move to the cheaper rung the
// controller makes after 4 s on a rung even when the model says no (a
// rate measured while the writer's own work slows the socket, as on
// loopback where the writing thread does the kernel's work for the peer,
// can make every rung but a cheaper one look right). When an exploration
// does not pay and the controller climbs back, the doubling time doubles,
// up to 4 s (and the forced period with it, up to 16 s), so a connection
// at its best rung pays for a one-epoch exploration every few seconds at
// most. Probe blocks (at most
// one every 200 ms, compressed at another rung and sent as they are,
// since frames name their codec) keep the estimates fresh: at off the
// first codec rung, to notice compressible data again; when the link
// limits, the next stronger rung, whose CPU is free then.
//
// The cost: two or three clock reads per block, a tcp_info read and a few dozen
// floating-point operations per epoch, no allocation, and about 1 KiB per
// connection that has written (the estimates). Control is per direction:
// each side's writer decides for what it sends.

// Controller tuning.
const (
	epochBytes  = 1 << 20                // an epoch ends after this many application bytes
	epochWall   = 50 * time.Millisecond  // and this much time,
	epochTime   = 100 * time.Millisecond // or after this much time spent in Write
	probeEvery  = 200 * time.Millisecond // the least time between two probe blocks
	probeBlocks = 8                      // and the fewest blocks
	baseExplore = time.Second            // the link estimate's doubling time, when unconfirmed
	maxExplore  = 4 * time.Second
	// forcedExplore is how long the controller stays on a rung before it
	// tries the cheaper one even when its model says no, times the
	// doubling time's growth (so 4 s, 8 s, then 16 s).
	forcedExplore = 4 * time.Second
	queuedBytes   = 64 << 10 // unsent bytes in the socket that show the link limits the writer
	blockedShare  = 0.3      // a writer that spends this share of its time in the socket is link-bound
	appShare      = 0.5      // a writer that spends less of the epoch's time in Write is application-bound
	upGain        = 1.10     // predicted gain needed to move up
	downLoss      = 0.97     // predicted share of the current goodput enough to move down
	maxRungs      = 8
)

// A rung is one setting of the auto layer: off, or a codec at a level,
// with its priors (compression speed in bytes per second on one core and
// ratio, on the text corpus of the benchmarks).
type rung struct {
	name         string
	id           codecID
	codec        blockCodec // nil for off
	speed, ratio float64
}

// A linkSample is what the kernel says about a TCP socket: the bytes the
// peer has acknowledged so far, the bytes written but not yet sent, and
// (Linux 4.10 on, hasRwnd) how long, in all, sending was held back by the
// peer's receive window: by a peer application that reads slower than the
// link carries.
type linkSample struct {
	acked       uint64
	notsent     uint32
	ok          bool
	hasRwnd     bool
	rwndLimited time.Duration
}

// controller decides, block by block, which rung a writer uses. It is
// part of one connection's write side and is guarded by its lock.
type controller struct {
	rungs   []rung
	cur     int
	speed   [maxRungs]float32 // measured compression speed, 0 if never measured
	rho     [maxRungs]float32 // relative strength: ratio_j = 1 + rho_j*kappa
	kappa   float64           // compressibility of the data
	phi     float64           // this machine's speed relative to the priors
	bw      float64           // link rate in wire bytes per second, 0 if unknown
	recv    float64           // the peer's reading rate in application bytes per second, 0 if it keeps up
	active  time.Duration     // time spent in Write, epochs past
	bwAt    time.Duration     // active when bw was last measured with the link limiting, -1 never
	explore time.Duration     // bw's doubling time while unconfirmed
	// explored: the last move down relied on the optimistic estimate;
	// exploredFrom is the rung it left.
	explored     bool
	exploredFrom int
	lastMove     time.Duration // active at the last move

	// The current epoch.
	start      time.Time
	n, m       int64         // application and wire bytes
	k, e       time.Duration // time spent compressing, and in Write
	cn, cm     int64         // application and wire bytes of non-probe blocks
	sn         int64         // application bytes of blocks compressed at the current rung
	sk         time.Duration // and the time it took
	link0      linkSample
	lastTight  bool // the last epoch found the link limiting
	lastProbe  time.Time
	sinceProbe int

	sample func() linkSample                                            // the kernel's view of the socket; nil if none
	trace  func(ct *controller, tight bool, rate float64, s linkSample) // tests: called after each epoch

	// Counters, for tests and benchmarks.
	moves, explorations, epochs int
	used                        [maxRungs]int64 // application bytes sent at each rung, probes included
}

func newController(rungs []rung, sample func() linkSample) *controller {
	ct := &controller{rungs: rungs, cur: min(1, len(rungs)-1), phi: 1, bwAt: -1, explore: baseExplore, sample: sample}
	if len(rungs) > 1 {
		ref := rungs[1].ratio - 1
		ct.kappa = ref
		for j := 1; j < len(rungs); j++ {
			ct.rho[j] = float32((rungs[j].ratio - 1) / ref)
		}
	}
	return ct
}

// begin starts the epoch's clock if it is not running.
func (ct *controller) begin(now time.Time) {
	if ct.start.IsZero() {
		ct.start = now
		if ct.sample != nil {
			ct.link0 = ct.sample()
		}
	}
}

// pick returns the rung the next block uses, and whether it is a probe.
// It ends the epoch first if it is due.
func (ct *controller) pick(now time.Time) (int, bool) {
	ct.begin(now)
	// The first epoch ends after its bytes: a cold start at the wrong rung
	// should not last.
	if ct.n >= epochBytes && (ct.epochs == 0 || now.Sub(ct.start) >= epochWall) || ct.e >= epochTime {
		ct.decide(now)
		ct.begin(now)
	}
	ct.sinceProbe++
	if ct.sinceProbe < probeBlocks || now.Sub(ct.lastProbe) < probeEvery {
		return ct.cur, false
	}
	p := -1
	switch {
	case ct.cur == 0 && len(ct.rungs) > 1:
		p = 1 // is the data compressible again?
	case ct.cur > 0 && ct.cur+1 < len(ct.rungs) && ct.lastTight:
		p = ct.cur + 1 // the link limits: is the stronger rung worth it?
	}
	if p < 0 {
		return ct.cur, false
	}
	ct.lastProbe, ct.sinceProbe = now, 0
	return p, true
}

// tried records a block compressed at rung j: its application bytes, its
// wire bytes (frame header included; raw size plus header if it did not
// shrink, ok false) and the time it took.
func (ct *controller) tried(j, raw, wire int, d time.Duration, ok, probe bool) {
	ct.k += d
	if !probe {
		if ok {
			ct.sn += int64(raw)
			ct.sk += d
		}
		return
	}
	if ok {
		ct.learnSpeed(j, float64(raw), d)
	}
	r := float64(raw) / float64(wire)
	if ct.cur == 0 && j == 1 {
		ct.learnKappa(1, r) // at off, the probe is all we know of the data
		return
	}
	if ct.kappa > 0.1 {
		ct.rho[j] = float32(blend(float64(ct.rho[j]), max(0, r-1)/ct.kappa))
	}
}

// account records a block sent (raw and wire bytes, whether it was a
// probe) and the time spent in Write since the last call.
func (ct *controller) account(j, raw, wire int, probe bool, d time.Duration) {
	ct.used[j] += int64(raw)
	ct.n += int64(raw)
	ct.m += int64(wire)
	ct.e += d
	if !probe {
		ct.cn += int64(raw)
		ct.cm += int64(wire)
	}
}

// spent records time spent in Write outside any block.
func (ct *controller) spent(d time.Duration) { ct.e += d }

// decide ends the epoch: it updates the model and moves.
func (ct *controller) decide(now time.Time) {
	ct.epochs++
	if ct.cur > 0 && ct.cn > 0 {
		ct.learnKappa(ct.cur, float64(ct.cn)/float64(ct.cm))
	}
	if ct.sn > 0 {
		ct.learnSpeed(ct.cur, float64(ct.sn), ct.sk)
	}
	ct.active += ct.e
	ct.learnLink(now)
	ct.move()
	ct.n, ct.m, ct.k, ct.e, ct.cn, ct.cm, ct.sn, ct.sk = 0, 0, 0, 0, 0, 0, 0, 0
	ct.start = time.Time{}
}

// learnLink updates the link estimate from the epoch.
func (ct *controller) learnLink(now time.Time) {
	wall := now.Sub(ct.start)
	if ct.m == 0 || ct.e <= 0 || wall <= 0 {
		ct.lastTight = false
		return
	}
	if float64(ct.e) < appShare*float64(wall) {
		ct.lastTight = false // the application, not the link or the CPU, set the pace
		return
	}
	rate := float64(ct.m) / ct.e.Seconds()
	// Without the kernel's word, a writer that spends a good share of its
	// time in the socket is taken as held back by the link; at off, the
	// socket is all there is to measure, whether the link or the system
	// calls set the pace. (A writer starved of CPU looks the same: the
	// kernel's word, below, is better.)
	tight := float64(ct.e-ct.k) >= blockedShare*float64(ct.e) || ct.cur == 0
	var last linkSample
	if ct.sample != nil {
		if s := ct.sample(); s.ok && ct.link0.ok {
			last = s
			if s.acked <= ct.link0.acked {
				ct.lastTight = false // nothing acknowledged: a stall tells no rate
				return
			}
			rate = float64(s.acked-ct.link0.acked) / wall.Seconds()
			// The link holds the writer back when bytes wait unsent.
			tight = s.notsent >= queuedBytes
			// The peer's window held the sender back: the peer reads
			// slower than the link carries, and compressing more only
			// gives it more to decode. What it acknowledged is its pace,
			// not the link's: the link is at least that fast.
			ct.recv = 0
			if s.hasRwnd && ct.link0.hasRwnd && float64(s.rwndLimited-ct.link0.rwndLimited) >= blockedShare*float64(wall) {
				ct.recv = float64(ct.n) / wall.Seconds()
				ct.lastTight = false
				ct.bw = max(ct.bw, rate)
				return
			}
		}
	}
	ct.lastTight = tight
	if ct.trace != nil {
		ct.trace(ct, tight, rate, last)
	}
	switch {
	case tight:
		ct.bw, ct.bwAt = blend(ct.bw, rate), ct.active
	case rate > ct.bw:
		ct.bw = rate // a lower bound
	}
}

// link returns the link rate the model uses: the estimate, grown while
// nothing confirms it, +Inf if there is none. It grows with the time
// spent writing, not idle: an idle connection learns nothing new about
// its link.
func (ct *controller) link() float64 {
	if ct.bw == 0 || ct.bwAt < 0 {
		return math.Inf(1)
	}
	return ct.bw * math.Exp2(float64(ct.active-ct.bwAt)/float64(ct.explore))
}

// predict returns rung j's predicted goodput in application bytes per
// second over a link of rate bw.
func (ct *controller) predict(j int, bw float64) float64 {
	g := bw
	if j > 0 {
		g = min(ct.speedOf(j), bw*ct.ratioOf(j))
	}
	if ct.recv > 0 {
		g = min(g, ct.recv)
	}
	return g
}

func (ct *controller) speedOf(j int) float64 {
	if ct.speed[j] > 0 {
		return float64(ct.speed[j])
	}
	return ct.rungs[j].speed * ct.phi
}

func (ct *controller) ratioOf(j int) float64 { return 1 + float64(ct.rho[j])*ct.kappa }

// move goes to the best of the cheaper rungs predicted nearly as good as
// the current one, if any, or else to the best of the stronger rungs
// predicted clearly better. Ties go to the cheaper rung.
func (ct *controller) move() {
	bw := ct.link()
	if ct.recv > 0 {
		bw = math.Inf(1) // the peer, not the link, sets the pace
	}
	from := ct.cur
	g := ct.predict(from, bw)
	to, best := from, 0.0
	for j := from - 1; j >= 0; j-- {
		if p := ct.predict(j, bw); p >= downLoss*g && p >= best {
			to, best = j, p
		}
	}
	// A rung the link seems to hold to is still left for the cheaper one,
	// now and then: a rate measured while the writer's own work slows the
	// socket (loopback, where the kernel's work for the peer is done by
	// the writing thread; a peer on the same machine) can make the link
	// look slower than it is at every rung but a cheaper one.
	forced := to == from && from > 0 && ct.active-ct.lastMove >= forcedExplore*(ct.explore/baseExplore)
	if forced {
		to = from - 1
	}
	if to < from {
		ct.cur = to
		ct.moves++
		adaptive.moves.Add(1)
		ct.lastMove = ct.active
		// Would the link estimate as measured, without growth, have
		// moved it?
		if m := ct.bw; forced || m == 0 || ct.bwAt < 0 || ct.predict(to, m) < downLoss*ct.predict(from, m) {
			ct.explorations++
			ct.explored, ct.exploredFrom = true, from
		} else {
			ct.explored = false
			ct.explore = baseExplore
		}
		return
	}
	for j := from + 1; j < len(ct.rungs); j++ {
		if p := ct.predict(j, bw); p >= upGain*g && p > best {
			to, best = j, p
		}
	}
	if to > from {
		ct.cur = to
		ct.moves++
		adaptive.moves.Add(1)
		ct.lastMove = ct.active
		if ct.explored && to >= ct.exploredFrom {
			ct.explore = min(2*ct.explore, maxExplore) // the exploration did not pay
		}
		ct.explored = false
	}
}

func (ct *controller) learnSpeed(j int, raw float64, d time.Duration) {
	if j == 0 || d <= 0 {
		return
	}
	s := raw / d.Seconds()
	ct.speed[j] = float32(blend(float64(ct.speed[j]), s))
	ct.phi = blend(ct.phi, s/ct.rungs[j].speed)
}

// learnKappa updates the data's compressibility from ratio r measured at
// rung j.
func (ct *controller) learnKappa(j int, r float64) {
	if ct.rho[j] > 0 {
		ct.kappa = blendAbs(ct.kappa, max(0, r-1)/float64(ct.rho[j]))
	}
}

// blend moves an estimate halfway to a measurement, or all the way when
// they differ by more than half, or when there is no estimate yet.
func blend(old, v float64) float64 {
	if old <= 0 || v > 1.5*old || v < old/1.5 {
		return v
	}
	return (old + v) / 2
}

// blendAbs is blend for a quantity that may be near zero (the
// compressibility of random data): it jumps on a change of more than 0.5
// in absolute terms too.
func blendAbs(old, v float64) float64 {
	if math.Abs(v-old) > 0.5 {
		return v
	}
	return blend(old, v)
}

package compress

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// The controller's tests run it against a model of a writer and a link on
// a fake clock, so its decisions are deterministic: the real transfers
// are in auto_test.go and the real figures in the benchmarks.

// simData is what the simulated application sends: for each rung, the
// ratio its blocks reach and its compression speed (application bytes
// per second).
type simData struct {
	name  string
	ratio map[string]float64
	speed map[string]float64
}

// textData compresses as the text corpus does, with zstd-6 doing better
// than its prior says (4.69), so the controller has something to learn.
var textData = simData{
	name:  "text",
	ratio: map[string]float64{"s2-1": 2.74, "s2-2": 2.94, "zstd-1": 4.37, "zstd-6": 5.6},
	speed: map[string]float64{"s2-1": 450e6, "s2-2": 220e6, "zstd-1": 160e6, "zstd-6": 40e6},
}

// randomData does not compress; failing costs little.
var randomData = simData{
	name:  "random",
	ratio: map[string]float64{"s2-1": 1, "s2-2": 1, "zstd-1": 1, "zstd-6": 1},
	speed: map[string]float64{"s2-1": 8e9, "s2-2": 6e9, "zstd-1": 3e9, "zstd-6": 2e9},
}

// simLink is a socket in front of a link: the writer's bytes enter a send
// buffer of bufSize, which the link drains at rate bytes per second;
// writing costs the writer perByte seconds of CPU per byte.
type simLink struct {
	rate, bufSize, perByte float64
	queued                 float64      // wire bytes in the send buffer
	acked                  float64      // wire bytes the link has delivered
	delivered              float64      // and the application bytes they carried
	segs                   [][2]float64 // the buffer's blocks: wire and application bytes
}

func (l *simLink) drain(d time.Duration) {
	budget := l.rate * d.Seconds()
	for budget > 0 && len(l.segs) > 0 {
		s := &l.segs[0]
		k := math.Min(budget, s[0])
		app := s[1] * k / s[0]
		s[0] -= k
		s[1] -= app
		budget -= k
		l.queued -= k
		l.acked += k
		l.delivered += app
		if s[0] <= 1e-9 {
			l.segs = l.segs[1:]
		}
	}
}

// sim is an application writing blocks through a writer run by a
// controller (or by a fixed rung) into a simLink, on a fake clock.
type sim struct {
	t      *testing.T
	rungs  []rung
	ct     *controller // nil: fixed rung
	fixed  int
	link   *simLink
	kernel bool // the controller sees tcp_info
	now    time.Time
	data   simData
	appGap time.Duration // the application's think time between writes
	rwnd   bool          // the peer reads slower than the link: tcp_info shows the window limiting

	sent    float64 // application bytes
	history []int   // the rung of each block
}

func newSim(t *testing.T, link simLink, data simData, kernel bool) *sim {
	t.Helper()
	return newSimOn(t, mustAuto(t, AutoConfig{}), link, data, kernel)
}

// newSimOn is newSim on a's ladder; data must name each of its rungs.
func newSimOn(t *testing.T, a *Auto, link simLink, data simData, kernel bool) *sim {
	t.Helper()
	s := &sim{t: t, rungs: a.rungs, link: &link, data: data, kernel: kernel, now: time.Unix(1e9, 0)}
	var sample func() linkSample
	if kernel {
		epoch := s.now
		sample = func() linkSample {
			ls := linkSample{acked: uint64(s.link.acked), notsent: uint32(s.link.queued), ok: true, hasRwnd: true}
			if s.rwnd {
				ls.rwndLimited = s.now.Sub(epoch) // limited all the time
			}
			return ls
		}
	}
	s.ct = newController(a.rungs, sample)
	return s
}

func (s *sim) advance(d time.Duration) {
	s.now = s.now.Add(d)
	s.link.drain(d)
}

func (s *sim) rungNamed(name string) int {
	for i, r := range s.rungs {
		if r.name == name {
			return i
		}
	}
	s.t.Fatalf("no rung %s in %v", name, s.rungs)
	return -1
}

// block sends one 128 KiB block and returns the rung it used.
func (s *sim) block() int {
	const n = MaxBlock
	if s.appGap > 0 {
		s.advance(s.appGap)
	}
	start := s.now
	j, probe := s.fixed, false
	if s.ct != nil {
		j, probe = s.ct.pick(s.now)
	}
	wire := float64(n + headerSize)
	if j > 0 {
		name := s.rungs[j].name
		s.advance(time.Duration(float64(n) / s.data.speed[name] * 1e9))
		ok := s.data.ratio[name] >= 16.0/15
		if ok {
			wire = n/s.data.ratio[name] + headerSize
		}
		if s.ct != nil {
			s.ct.tried(j, n, int(wire), s.now.Sub(start), ok, probe)
		}
	}
	// The write: CPU for the copy, then wait for room in the buffer.
	s.advance(time.Duration(wire * s.link.perByte * 1e9))
	if room := s.link.bufSize - s.link.queued; wire > room {
		s.advance(time.Duration((wire - room) / s.link.rate * 1e9))
	}
	s.link.queued += wire
	s.link.segs = append(s.link.segs, [2]float64{wire, n})
	if s.ct != nil {
		s.ct.account(j, n, int(wire), probe, s.now.Sub(start))
	}
	s.sent += n
	s.history = append(s.history, j)
	return j
}

// run sends for d of simulated time and returns the goodput over it, in
// application bytes per second, counting what the link delivered.
func (s *sim) run(d time.Duration) float64 {
	start, delivered0 := s.now, s.link.delivered
	for s.now.Sub(start) < d {
		s.block()
	}
	return (s.link.delivered - delivered0) / s.now.Sub(start).Seconds()
}

// last returns the most used rung among the last n blocks.
func (s *sim) last(n int) string {
	count := map[int]int{}
	for _, j := range s.history[max(0, len(s.history)-n):] {
		count[j]++
	}
	best := 0
	for j, c := range count {
		if c > count[best] {
			best = j
		}
	}
	return s.rungs[best].name
}

var (
	fastLink = simLink{rate: 2e9, bufSize: 4 << 20, perByte: 1 / 3e9} // loopback
	link100M = simLink{rate: 12.5e6, bufSize: 4 << 20, perByte: 1 / 3e9}
	link1G   = simLink{rate: 125e6, bufSize: 4 << 20, perByte: 1 / 3e9}
	link10M  = simLink{rate: 1.25e6, bufSize: 1 << 20, perByte: 1 / 3e9}
)

// bestFixed returns the best fixed rung's name and goodput on the link
// and data, each rung simulated as the controller would see it.
func bestFixed(t *testing.T, link simLink, data simData, d time.Duration) (string, float64, map[string]float64) {
	s := newSim(t, link, data, false)
	all := map[string]float64{}
	best, bestG := "", 0.0
	for j, r := range s.rungs {
		f := newSim(t, link, data, false)
		f.ct, f.fixed = nil, j
		f.run(d / 4) // fill the buffer
		g := f.run(d)
		all[r.name] = g
		if g > bestG {
			best, bestG = r.name, g
		}
	}
	return best, bestG, all
}

// TestControllerConverges runs the controller on each link and data for
// 20 simulated seconds, with and without tcp_info, and checks that it
// ends on the best fixed rung's goodput (within 10%; random data within
// 5% of off) and stays there: few moves once settled.
func TestControllerConverges(t *testing.T) {
	links := []struct {
		name string
		link simLink
	}{{"loopback", fastLink}, {"1G", link1G}, {"100M", link100M}, {"10M", link10M}}
	for _, l := range links {
		for _, data := range []simData{textData, randomData} {
			best, bestG, all := bestFixed(t, l.link, data, 5*time.Second)
			for _, kernel := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/tcpinfo=%t", l.name, data.name, kernel), func(t *testing.T) {
					s := newSim(t, l.link, data, kernel)
					s.run(5 * time.Second) // settle
					blocks0, moves0 := len(s.history), s.ct.moves
					g := s.run(15 * time.Second)
					n, moves := len(s.history)-blocks0, s.ct.moves-moves0
					t.Logf("auto %.1f MB/s on %s (%d moves in %d blocks, %d explorations); best fixed %s %.1f MB/s; all %v",
						g/1e6, s.last(n), moves, n, s.ct.explorations, best, bestG/1e6, all)
					want := 0.9
					if data.name == "random" {
						want = 0.95
					}
					if g < want*bestG {
						t.Errorf("auto %.1f MB/s, below %.0f%% of the best fixed rung %s at %.1f MB/s", g/1e6, want*100, best, bestG/1e6)
					}
					// At most one exploration and its return every 2 s.
					if moves > 16 {
						t.Errorf("%d moves in 15 s once settled", moves)
					}
				})
			}
		}
	}
}

// until runs the simulation until the controller sits on rung name and
// returns how long that took, or fails after limit.
func (s *sim) until(name string, limit time.Duration) time.Duration {
	s.t.Helper()
	want, start := s.rungNamed(name), s.now
	for s.ct.cur != want {
		if s.now.Sub(start) > limit {
			s.t.Fatalf("still on %s after %v, want %s (history tail %v)", s.rungs[s.ct.cur].name, limit, name, s.history[max(0, len(s.history)-20):])
		}
		s.block()
	}
	return s.now.Sub(start)
}

// TestControllerReacts changes the data and the link under a running
// controller and checks how soon it reaches the new best rung: a change
// that makes the current rung worse is seen at the next epoch; a faster
// link is only found by exploring, within a few seconds.
func TestControllerReacts(t *testing.T) {
	for _, kernel := range []bool{false, true} {
		t.Run(fmt.Sprintf("tcpinfo=%t", kernel), func(t *testing.T) {
			s := newSim(t, link100M, textData, kernel)
			steps := []struct {
				what  string
				set   func()
				want  string
				limit time.Duration
			}{
				{"start, text over 100 Mbit/s", func() {}, "zstd-1", time.Second},
				{"text to random", func() { s.data = randomData }, "off", 500 * time.Millisecond},
				{"random to text", func() { s.data = textData }, "zstd-1", 500 * time.Millisecond},
				{"100 Mbit/s to 1 Gbit/s", func() { s.link.rate = link1G.rate }, "s2-1", 4 * time.Second},
				{"1 Gbit/s to 100 Mbit/s", func() { s.link.rate = link100M.rate }, "zstd-1", 500 * time.Millisecond},
				{"100 Mbit/s to 10 Mbit/s", func() { s.link.rate = link10M.rate }, "zstd-6", 2 * time.Second},
				{"10 Mbit/s to loopback speed", func() { s.link.rate = fastLink.rate }, "off", 6 * time.Second},
			}
			for _, st := range steps {
				st.set()
				d := s.until(st.want, st.limit)
				t.Logf("%s: on %s after %v", st.what, st.want, d)
				// And it stays: at most one exploration and its return
				// in the next 2 s.
				moves := s.ct.moves
				s.run(2 * time.Second)
				if m := s.ct.moves - moves; m > 2 || s.rungs[s.ct.cur].name != st.want {
					t.Errorf("%s: %d moves in the 2 s after reaching %s, now on %s", st.what, m, st.want, s.rungs[s.ct.cur].name)
				}
			}
		})
	}
}

// TestControllerAppLimited: an application that writes slower than any
// rung can carry sets the pace whatever the controller does; the
// controller must not wander while it does.
func TestControllerAppLimited(t *testing.T) {
	s := newSim(t, link100M, textData, true)
	s.appGap = 20 * time.Millisecond // 128 KiB every 20 ms: 6.5 MB/s
	s.run(2 * time.Second)
	moves := s.ct.moves
	g := s.run(10 * time.Second)
	if m := s.ct.moves - moves; m > 4 {
		t.Errorf("%d moves in 10 s of an application-bound transfer", m)
	}
	if want := float64(MaxBlock) / 0.020; g < 0.95*want {
		t.Errorf("goodput %.1f MB/s, the application writes %.1f MB/s", g/1e6, want/1e6)
	}
	t.Logf("on %s, %.1f MB/s", s.rungs[s.ct.cur].name, g/1e6)
}

// TestLadder checks the rungs built from the codecs and levels allowed.
func TestLadder(t *testing.T) {
	for _, tc := range []struct {
		cfg  AutoConfig
		want string
	}{
		{AutoConfig{}, "off s2-1 s2-2 zstd-1 zstd-6"},
		{AutoConfig{MaxLevel: 22}, "off s2-1 s2-2 zstd-1 zstd-6 zstd-10"},
		{AutoConfig{MaxLevel: 3}, "off s2-1 s2-2 zstd-1"},
		{AutoConfig{Codecs: []string{"zstd"}, MaxLevel: 22}, "off zstd-1 zstd-6 zstd-10"},
		{AutoConfig{Codecs: []string{"lz4"}}, "off lz4-0 lz4-3"},
		{AutoConfig{Codecs: []string{"deflate"}, MaxLevel: 1}, "off deflate-1"},
		{AutoConfig{Codecs: []string{"zstd", "s2", "deflate", "lz4"}}, "off s2-1 s2-2 zstd-1 zstd-6 deflate-9"},
	} {
		a, err := NewAuto(tc.cfg)
		if err != nil {
			t.Fatalf("%+v: %v", tc.cfg, err)
		}
		if got := fmt.Sprint(a.Rungs()); got != "["+tc.want+"]" {
			t.Errorf("%+v: rungs %s, want [%s]", tc.cfg, got, tc.want)
		}
	}
}

// TestControllerReceiverBound: when tcp_info shows the peer's window
// holding the sender back, the peer reads slower than the link carries;
// compressing only gives it more to decode, so the controller goes to off
// and stays there while the peer is the bottleneck, and compresses again
// once it is not.
func TestControllerReceiverBound(t *testing.T) {
	s := newSim(t, link100M, textData, true)
	s.until("zstd-1", time.Second)
	s.rwnd = true
	d := s.until("off", time.Second)
	moves := s.ct.moves
	s.run(5 * time.Second)
	if m := s.ct.moves - moves; m > 2 || s.ct.cur != 0 {
		t.Errorf("%d moves in 5 s with the peer the bottleneck, now on %s", m, s.rungs[s.ct.cur].name)
	}
	s.rwnd = false
	d2 := s.until("zstd-1", time.Second)
	t.Logf("to off in %v, back to zstd-1 in %v", d, d2)
}

package parallelstreams

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// hangTimeout only keeps a broken loop from hanging the test; no
// assertion depends on how long anything takes.
const hangTimeout = 20 * time.Second

// autoTickRead is what the auto-grow loop reads at one tick.
type autoTickRead struct {
	dt     time.Duration // since the tick before; autoTick if 0
	bytes  int64         // what the applications read: goodput
	active bool          // the link, not the applications, set the pace
}

// busy is a tick in which the link, not the applications, set the pace.
func busy(bytes int64) autoTickRead { return autoTickRead{bytes: bytes, active: true} }

// idle is a tick in which the applications had nothing more to move.
func idle(bytes int64) autoTickRead { return autoTickRead{bytes: bytes} }

// repeat is n copies of r.
func repeat(n int, r autoTickRead) []autoTickRead {
	rs := make([]autoTickRead, n)
	for i := range rs {
		rs[i] = r
	}
	return rs
}

// script joins runs of ticks.
func script(runs ...[]autoTickRead) []autoTickRead {
	var all []autoTickRead
	for _, r := range runs {
		all = append(all, r...)
	}
	return all
}

// The ticks of one settling: autoSettle of ticks the loop does not
// measure, and of one window.
var (
	settleTicks = int(autoSettle / autoTick)
	windowTicks = int(autoWindow / autoTick)
)

// fakeLink plays a script of ticks to the loop. Its clock and goodput
// move only when the loop measures (once to start, then once a tick), so
// what the loop sees does not depend on scheduling. Only the loop's
// goroutine calls it.
type fakeLink struct {
	ticks   []autoTickRead
	n       int // measurements so far
	now     time.Time
	goodput int64
	cur     autoTickRead

	// trace[k] is the substreams as tick k+1 is measured, before the
	// loop decides anything on it. s is set before the first tick, which
	// orders it before the loop's reads.
	s     *Session
	trace []int
}

func (f *fakeLink) measure() (time.Time, int64) {
	if f.n > 0 {
		f.trace = append(f.trace, f.s.Streams())
		f.cur = autoTickRead{} // past the script: idle ticks, no decision
		if f.n <= len(f.ticks) {
			f.cur = f.ticks[f.n-1]
		}
		if f.cur.dt == 0 {
			f.cur.dt = autoTick
		}
		f.now = f.now.Add(f.cur.dt)
		f.goodput += f.cur.bytes
	}
	f.n++
	return f.now, f.goodput
}

func (f *fakeLink) clock() time.Time { return f.now }

func (f *fakeLink) active() bool { return f.cur.active }

// pipeLower dials substreams as in-memory pipes whose far ends swallow
// everything: a dialer's session with no listener, whose growth costs no
// network.
type pipeLower struct{}

func (pipeLower) DialContext(context.Context, string, string) (net.Conn, error) {
	near, far := net.Pipe()
	go func() {
		io.Copy(io.Discard, far) // ends when the session closes near
		far.Close()
	}()
	return near, nil
}

func (pipeLower) Path() string { return "pipe" }

// failLower dials ok substreams as pipeLower does, then fails.
type failLower struct {
	ok    int
	mu    sync.Mutex
	dials int
}

func (f *failLower) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	f.mu.Lock()
	f.dials++
	n := f.dials
	f.mu.Unlock()
	if n > f.ok {
		return nil, errors.New("connection refused")
	}
	return pipeLower{}.DialContext(ctx, network, address)
}

func (*failLower) Path() string { return "pipe, then refused" }

// TestAutoGrowDecisions drives the auto-grow loop of a dialed session
// tick by tick with a fake clock and goodput, and checks when it adds
// substreams and when it gives up. After the start and after each
// growth, settleTicks ticks only let the substreams ramp up; then
// windowTicks ticks in which the link set the pace make a window.
func TestAutoGrowDecisions(t *testing.T) {
	const (
		endClose = "close"
		endFail  = "fail"
	)
	// 1000 bytes a second with the first 2 substreams, then a growth to 8.
	first := script(repeat(settleTicks, busy(100)), repeat(windowTicks, busy(100)))
	settle := repeat(settleTicks, busy(1000)) // what it carries does not count
	window := func(bytes int64) []autoTickRead { return repeat(windowTicks, busy(bytes)) }
	tests := []struct {
		name  string
		max   int // the layer's streams parameter
		lower layer.Lower
		ticks []autoTickRead
		end   string // how the session ends after the script: endClose or endFail
		want  int    // substreams after the script
		// The tick after which the loop ends by itself, or 0 if it must
		// still run when the script is over.
		stopAfter int
	}{
		{
			name:  "ramp-up ticks are not measured",
			max:   16,
			ticks: repeat(settleTicks, busy(100)),
			want:  2,
		},
		{
			name:  "a window short of its time decides nothing",
			max:   16,
			ticks: first[:len(first)-1],
			want:  2,
		},
		{
			name:  "the first window grows fourfold",
			max:   16,
			ticks: first,
			want:  8,
		},
		{
			name:  "no growth while the applications set the pace",
			max:   16,
			ticks: repeat(4*(settleTicks+windowTicks), idle(100)),
			want:  2,
		},
		{
			name:  "doubles on 10% more goodput",
			max:   32,
			ticks: script(first, settle, window(111)),
			want:  16,
		},
		{
			name:  "reaching the maximum ends the loop",
			max:   16,
			ticks: script(first, settle, window(111)),
			want:  16,
			// and takes no tick after the growth to 16
			stopAfter: len(first) + settleTicks + windowTicks,
		},
		{
			name:  "less than 10% more twice is no gain",
			max:   16,
			ticks: script(first, settle, window(109), window(109)),
			want:  8,
			// the two windows are judged together: 1090 a second
			stopAfter: len(first) + settleTicks + 2*windowTicks,
		},
		{
			name:  "a miss is judged again with the next window",
			max:   32,
			ticks: script(first, settle, window(105), window(120)),
			// (525 + 600) bytes in a second beat 1100 a second
			want: 16,
		},
		{
			name: "a burst after a stall is no baseline",
			max:  32,
			// A stall holds two ticks' blocks, which arrive in one tick of
			// the first window, at 5000 a second. The window's average
			// (1400 a second), not the burst, is what the next must beat.
			ticks: script(repeat(settleTicks, busy(100)), []autoTickRead{busy(100), busy(0), busy(0), busy(500), busy(100)},
				settle, window(160)),
			want: 16,
		},
		{
			name:  "ticks the applications paced are not counted",
			max:   32,
			ticks: script(first, settle, repeat(3, idle(0)), window(150)),
			want:  16,
		},
		{
			name: "goodput is per second: slow ticks' bytes are no gain",
			max:  32,
			// 150 bytes in 200ms is 750 a second, below the 1000 measured
			// with 2: a window closes after 3 such ticks, the second after 5.
			ticks:     script(first, settle, repeat(5, autoTickRead{dt: 2 * autoTick, bytes: 150, active: true})),
			want:      8,
			stopAfter: len(first) + settleTicks + 5,
		},
		{
			name: "goodput is per second: fast ticks' bytes are a gain",
			max:  32,
			// 60 bytes in 50ms is 1200 a second, 20% above 1000.
			ticks: script(first, settle, repeat(2*windowTicks, autoTickRead{dt: autoTick / 2, bytes: 60, active: true})),
			want:  16,
		},
		{
			name:      "an odd maximum",
			max:       3,
			ticks:     first,
			want:      3,
			stopAfter: len(first),
		},
		{
			name:      "a refused dial stops the growth",
			max:       16,
			lower:     &failLower{ok: 4},
			ticks:     script(first, settle, window(1000)),
			want:      4,
			stopAfter: len(first),
		},
		{
			name:  "stops when the session closes",
			max:   16,
			ticks: repeat(3, busy(100)),
			end:   endClose,
			want:  2,
		},
		{
			name:  "stops when the session fails",
			max:   32,
			ticks: first,
			end:   endFail,
			want:  8,
		},
	}
	hung := false // a hang means no loop runs at all: the other cases would only wait too
	for _, tt := range tests {
		if hung {
			t.Fatal("skipping the remaining cases after a hang")
		}
		t.Run(tt.name, func(t *testing.T) {
			link := &fakeLink{ticks: tt.ticks, now: time.Unix(1_000_000_000, 0)}
			tick := make(chan time.Time)
			done := make(chan struct{})
			l := &Layer{Streams: tt.max, Auto: true, Window: 1 << 20, StallTimeout: time.Minute,
				autoFake: &autoFake{tick: tick, measure: link.measure, now: link.clock, active: link.active, done: done}}
			lower := tt.lower
			if lower == nil {
				lower = pipeLower{}
			}
			c, err := l.Dial(context.Background(), "pipe", "peer", lower)
			if err != nil {
				t.Fatal(err)
			}
			s := c.(*Session)
			defer s.Close()
			link.s = s
			if n := s.Streams(); n != 2 {
				t.Fatalf("auto session starts with %d substreams, want 2", n)
			}

			// The loop takes a tick only when it waits for one, so once the
			// next tick is taken the tick before, growth included, is
			// over. One tick past the script (an idle one, which decides
			// nothing) tells whether the loop still runs.
			took := 0
			for range len(tt.ticks) + 1 {
				if !tickOrEnd(t, tick, done, &hung) {
					break
				}
				took++
			}

			switch tt.end {
			case endFail:
				s.fail(errors.New("a substream failed"))
			default:
				s.Close()
			}
			select {
			case <-done:
			case <-time.After(hangTimeout):
				hung = true
				t.Fatalf("the loop still runs %v after the session ended (%s)", hangTimeout, tt.end)
			}
			// The loop is over: its trace can be read.
			n := s.Streams()
			switch running := took == len(tt.ticks)+1; {
			case tt.stopAfter == 0 && !running:
				t.Errorf("the loop ended after tick %d of %d (substreams by tick: %v, then %d), want it still running", took, len(tt.ticks), link.trace, n)
			case tt.stopAfter > 0 && took != tt.stopAfter:
				t.Errorf("the loop took %d ticks (substreams by tick: %v, then %d), want it to end after tick %d", took, link.trace, n, tt.stopAfter)
			}
			if n != tt.want {
				t.Errorf("%d substreams (by tick: %v), want %d", n, link.trace, tt.want)
			}
		})
	}
}

// tickOrEnd hands the loop its next round, or reports false if the loop
// has ended. It sets *hung if the loop does neither.
func tickOrEnd(t *testing.T, tick chan<- time.Time, done <-chan struct{}, hung *bool) bool {
	t.Helper()
	select {
	case tick <- time.Time{}:
		return true
	case <-done:
		return false
	case <-time.After(hangTimeout):
		*hung = true
		t.Fatalf("the auto-grow loop neither took a round nor ended in %v", hangTimeout)
		return false
	}
}

// TestPaced: over a path longer than about 50 ms, the ramp-up and the
// window grow with the dials' time, within bounds.
func TestPaced(t *testing.T) {
	tests := []struct {
		dial, settle, window time.Duration
	}{
		{0, autoSettle, autoWindow},
		{100 * time.Millisecond, autoSettle, autoWindow},                           // 50 ms: the floors
		{600 * time.Millisecond, 1200 * time.Millisecond, 2400 * time.Millisecond}, // 200 ms
		{time.Minute, autoMaxSettle, autoMaxWindow},                                // a dial that retried
	}
	for _, tt := range tests {
		t.Run(tt.dial.String(), func(t *testing.T) {
			if settle, window := paced(tt.dial); settle != tt.settle || window != tt.window {
				t.Errorf("paced(%v) = %v, %v; want %v, %v", tt.dial, settle, window, tt.settle, tt.window)
			}
		})
	}
}

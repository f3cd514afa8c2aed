package parallelstreams

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// hangTimeout only keeps a broken loop from hanging the test; no
// assertion depends on how long anything takes.
const hangTimeout = 20 * time.Second

// autoRound is what the auto-grow loop reads in one round.
type autoRound struct {
	dt      time.Duration // since the round before; autoInterval if 0
	bytes   int64         // what the peer's application read: goodput
	backlog bool          // the writer had more than the substreams took
}

// busy is a round in which the link, not the application, set the pace.
func busy(bytes int64) autoRound { return autoRound{bytes: bytes, backlog: true} }

// idle is a round in which the application had nothing more to send.
func idle(bytes int64) autoRound { return autoRound{bytes: bytes} }

// fakeLink plays a script of rounds to the loop. Its clock and credit
// move only when the loop measures (once to start, then once a round),
// so what the loop sees does not depend on scheduling. Only the loop's
// goroutine calls it.
type fakeLink struct {
	rounds []autoRound
	n      int // measurements so far
	now    time.Time
	credit int64
	cur    autoRound

	// trace[k] is the substreams after round k (trace[0]: at the start),
	// taken as round k+1 starts, before it decides anything. s is set
	// before the first tick, which orders it before the loop's reads.
	s     *Session
	trace []int
}

func (f *fakeLink) measure() (time.Time, int64) {
	if f.n > 0 {
		f.trace = append(f.trace, f.s.Streams())
		f.cur = autoRound{} // past the script: idle rounds, no decision
		if f.n <= len(f.rounds) {
			f.cur = f.rounds[f.n-1]
		}
		if f.cur.dt == 0 {
			f.cur.dt = autoInterval
		}
		f.now = f.now.Add(f.cur.dt)
		f.credit += f.cur.bytes
	}
	f.n++
	return f.now, f.credit
}

func (f *fakeLink) backlogged() bool { return f.cur.backlog }

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

// TestAutoGrowDecisions drives the auto-grow loop of a dialed session
// round by round with a fake clock and goodput, and checks when it adds
// substreams and when it gives up. Rounds 1 and 2, and the 2 rounds after
// each growth, only let new substreams ramp up.
func TestAutoGrowDecisions(t *testing.T) {
	const (
		endClose = "close"
		endFail  = "fail"
	)
	tests := []struct {
		name   string
		max    int // the layer's streams parameter
		rounds []autoRound
		end    string // how the session ends after the script: endClose or endFail
		want   int    // substreams after the script
		// The round after which the loop ends by itself, or 0 if it must
		// still run when the script is over.
		stopAfter int
	}{
		{
			name:   "ramp-up rounds are not measured",
			max:    8,
			rounds: []autoRound{busy(100), busy(1000)},
			want:   2,
		},
		{
			name:   "first round the link sets the pace doubles",
			max:    8,
			rounds: []autoRound{busy(100), busy(100), busy(100)},
			want:   4,
		},
		{
			name:   "no growth while the application sets the pace",
			max:    8,
			rounds: []autoRound{idle(100), idle(200), idle(400), idle(800), idle(1600), idle(3200), idle(6400)},
			want:   2,
		},
		{
			name: "doubles again on 10% more goodput",
			max:  16,
			// Rounds 4 and 5 are ramp-up: their goodput counts for nothing.
			rounds: []autoRound{busy(100), busy(100), busy(100), busy(1000), busy(1000), busy(111)},
			want:   8,
		},
		{
			name:   "less than 10% more is no gain",
			max:    16,
			rounds: []autoRound{busy(100), busy(100), busy(100), busy(100), busy(100), busy(109)},
			want:   4,
		},
		{
			name:      "gives up after two rounds without gain",
			max:       16,
			rounds:    []autoRound{busy(100), busy(100), busy(100), busy(100), busy(100), busy(109), busy(100)},
			want:      4,
			stopAfter: 7,
		},
		{
			name:   "a gain forgives a miss",
			max:    16,
			rounds: []autoRound{busy(100), busy(100), busy(100), busy(100), busy(100), busy(105), busy(120)},
			want:   8,
		},
		{
			name:   "rounds the application paced are not misses",
			max:    16,
			rounds: []autoRound{busy(100), busy(100), busy(100), busy(100), busy(100), idle(0), idle(0), idle(0), busy(150)},
			want:   8,
		},
		{
			name: "goodput is per second: a late round's bytes are no gain",
			max:  16,
			// 150 bytes in 1s is 150/s, below the 200/s measured with 2.
			rounds: []autoRound{
				busy(100), busy(100), busy(100), busy(100), busy(100),
				{dt: time.Second, bytes: 150, backlog: true}, {dt: time.Second, bytes: 150, backlog: true},
			},
			want:      4,
			stopAfter: 7,
		},
		{
			name: "goodput is per second: an early round's bytes are a gain",
			max:  16,
			// 60 bytes in 250ms is 240/s, 20% above 200/s.
			rounds: []autoRound{
				busy(100), busy(100), busy(100), busy(100), busy(100),
				{dt: autoInterval / 2, bytes: 60, backlog: true},
			},
			want: 8,
		},
		{
			name: "stops at its maximum",
			max:  6,
			rounds: []autoRound{
				busy(100), busy(100), busy(100), // 2 -> 4
				busy(200), busy(200), busy(200), // 4 -> 6, not 8
				busy(400), busy(400), busy(400), // at the maximum: done
			},
			want:      6,
			stopAfter: 9,
		},
		{
			name:      "an odd maximum",
			max:       3,
			rounds:    []autoRound{busy(100), busy(100), busy(100), busy(200), busy(200), busy(400)},
			want:      3,
			stopAfter: 6,
		},
		{
			name:   "stops when the session closes",
			max:    8,
			rounds: []autoRound{busy(100), busy(100)},
			end:    endClose,
			want:   2,
		},
		{
			name:   "stops when the session fails",
			max:    8,
			rounds: []autoRound{busy(100), busy(100), busy(100), busy(100)},
			end:    endFail,
			want:   4,
		},
	}
	hung := false // a hang means no loop runs at all: the other cases would only wait too
	for _, tt := range tests {
		if hung {
			t.Fatal("skipping the remaining cases after a hang")
		}
		t.Run(tt.name, func(t *testing.T) {
			link := &fakeLink{rounds: tt.rounds, now: time.Unix(1_000_000_000, 0)}
			tick := make(chan time.Time)
			done := make(chan struct{})
			l := &Layer{Streams: tt.max, Auto: true, Window: 1 << 20, StallTimeout: time.Minute,
				autoFake: &autoFake{tick: tick, measure: link.measure, backlogged: link.backlogged, done: done}}
			c, err := l.Dial(context.Background(), "pipe", "peer", pipeLower{})
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
			// next tick is taken the round before, growth included, is
			// over. One tick past the script (an idle round, which decides
			// nothing) tells whether the loop still runs.
			took := 0
			for range len(tt.rounds) + 1 {
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
			switch running := took == len(tt.rounds)+1; {
			case tt.stopAfter == 0 && !running:
				t.Errorf("the loop ended after round %d of %d (substreams by round: %v, then %d), want it still running", took, len(tt.rounds), link.trace, n)
			case tt.stopAfter > 0 && took != tt.stopAfter:
				t.Errorf("the loop took %d rounds (substreams by round: %v, then %d), want it to end after round %d", took, link.trace, n, tt.stopAfter)
			}
			if n != tt.want {
				t.Errorf("%d substreams (by round: %v), want %d", n, link.trace, tt.want)
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

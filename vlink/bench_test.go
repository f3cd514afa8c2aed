package vlink_test

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// dialers are compared side by side in one run: net.Dial is the baseline
// for vlink.Dial with a plain stack, which must cost nothing.
var dialers = []struct {
	name string
	dial func(addr string) (net.Conn, error)
}{
	{"net.Dial", func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }},
	{"vlink.Dial", func(addr string) (net.Conn, error) {
		d := vlink.Dialer{Stack: vlink.MustParse("tcp")}
		return d.Dial("tcp", addr)
	}},
}

func benchServer(b *testing.B, handle func(net.Conn)) string {
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	testnet.Serve(b, l, handle)
	return l.Addr().String()
}

// BenchmarkBulk writes 1 MiB chunks to a sink on loopback.
func BenchmarkBulk(b *testing.B) {
	addr := benchServer(b, func(c net.Conn) { io.Copy(io.Discard, c) })
	buf := make([]byte, 1<<20)
	for _, d := range dialers {
		b.Run(d.name, func(b *testing.B) {
			c, err := d.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRoundTrip measures a 1-byte ping-pong on loopback.
func BenchmarkRoundTrip(b *testing.B) {
	addr := benchServer(b, func(c net.Conn) {
		one := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, one); err != nil {
				return
			}
			if _, err := c.Write(one); err != nil {
				return
			}
		}
	})
	for _, d := range dialers {
		b.Run(d.name, func(b *testing.B) {
			c, err := d.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			one := []byte{1}
			for b.Loop() {
				if _, err := c.Write(one); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDialPaired runs net.Dial and vlink.Dial side by side, taking
// turns within every iteration so that the machine's noise falls on both
// alike, and reports each one's rate and their ratio: the figures
// docs/BENCHMARKS.md holds to 0.97x (bulk) and 5% (round trip).
func BenchmarkDialPaired(b *testing.B) {
	sink := benchServer(b, func(c net.Conn) { io.Copy(io.Discard, c) })
	echo := benchServer(b, func(c net.Conn) {
		one := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, one); err != nil {
				return
			}
			if _, err := c.Write(one); err != nil {
				return
			}
		}
	})
	dial := func(addr string) [2]net.Conn {
		var cs [2]net.Conn
		for i, d := range dialers {
			c, err := d.dial(addr)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			cs[i] = c
		}
		return cs
	}
	b.Run("bulk", func(b *testing.B) {
		cs := dial(sink)
		buf := make([]byte, 1<<20)
		const chunks = 8 // per turn: short turns spread the noise on both
		var took [2]time.Duration
		turn := 0
		for b.Loop() {
			// Alternate who goes first: the one going second shares the
			// CPU with the sink still draining the first one's bytes.
			turn++
			for k := range cs {
				i := (k + turn) % 2
				c := cs[i]
				start := time.Now()
				for range chunks {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				took[i] += time.Since(start)
			}
		}
		mb := float64(b.N*chunks*len(buf)) / 1e6
		b.ReportMetric(mb/took[0].Seconds(), "net-MB/s")
		b.ReportMetric(mb/took[1].Seconds(), "vlink-MB/s")
		b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "vlink/net")
		testnet.CheckTarget(b, "vlink.Dial / net.Dial, bulk", took[0].Seconds()/took[1].Seconds(), ">=", 0.97)
	})
	b.Run("roundtrip", func(b *testing.B) {
		cs := dial(echo)
		one := []byte{1}
		const trips = 1000 // per turn
		var took [2]time.Duration
		turn := 0
		for b.Loop() {
			turn++
			for k := range cs {
				i := (k + turn) % 2
				c := cs[i]
				start := time.Now()
				for range trips {
					if _, err := c.Write(one); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, one); err != nil {
						b.Fatal(err)
					}
				}
				took[i] += time.Since(start)
			}
		}
		n := float64(b.N * trips)
		b.ReportMetric(float64(took[0].Microseconds())/n, "net-µs/rtt")
		b.ReportMetric(float64(took[1].Microseconds())/n, "vlink-µs/rtt")
		b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "vlink/net")
		testnet.CheckTarget(b, "vlink.Dial / net.Dial, round trip time", took[1].Seconds()/took[0].Seconds(), "<=", 1.05)
	})
}

// BenchmarkBestEffortDial: the best-effort selector must not tax the
// common case. A destination reachable directly, with a route that races
// try = ["direct", "test-xor"], is dialed (connect, close) against
// net.Dial to the same plain listener, in interleaved rounds of 20 dials
// each, rotating who goes first; a third dialer, net.Dialer with a 10 s
// Timeout (what vlink tunnel and most servers dial with), shows what a
// cancellable dial costs by itself: a race cancels its losers through
// their context, so the way it dials first pays that cost too. It reports
// the median ratio of the rounds and their quartiles, against each; the
// target (issue 12) is 1.05x net.Dial.
func BenchmarkBestEffortDial(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	testnet.Serve(b, ln, func(c net.Conn) { c.Close() })
	addr := ln.Addr().String()
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.1", Try: []string{selector.TryDirect, "test-xor"}}}, selector.Rule{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	best := &vlink.Dialer{Config: cfg}
	nd, timed := &net.Dialer{}, &net.Dialer{Timeout: 10 * time.Second}
	ctx := context.Background()
	names := []string{"net.Dial", "net.Dialer{Timeout: 10s}", "best effort"}
	dials := []func() (net.Conn, error){
		func() (net.Conn, error) { return nd.DialContext(ctx, "tcp", addr) },
		func() (net.Conn, error) { return timed.DialContext(ctx, "tcp", addr) },
		func() (net.Conn, error) { return best.DialContext(ctx, "tcp", addr) },
	}
	const perRound = 20
	ratios := make([][]float64, len(dials))
	var overTimed []float64 // best effort / the timed dialer, per round
	took := make([]time.Duration, len(dials))
	round := 0
	for b.Loop() {
		round++
		t := make([]time.Duration, len(dials))
		for k := range dials {
			i := (k + round) % len(dials)
			start := time.Now()
			for range perRound {
				c, err := dials[i]()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			t[i] = time.Since(start)
		}
		for i := range dials {
			took[i] += t[i]
			ratios[i] = append(ratios[i], t[i].Seconds()/t[0].Seconds())
		}
		overTimed = append(overTimed, t[2].Seconds()/t[1].Seconds())
	}
	n := float64(b.N * perRound)
	for i, name := range names {
		r := ratios[i]
		slices.Sort(r)
		b.Logf("%-26s %5.1f µs a dial; / net.Dial median %.3f (quartiles %.3f .. %.3f), %d rounds of %d",
			name, float64(took[i].Microseconds())/n, r[len(r)/2], r[len(r)/4], r[3*len(r)/4], len(r), perRound)
	}
	slices.Sort(overTimed)
	b.Logf("%-26s / net.Dialer{Timeout: 10s} median %.3f (quartiles %.3f .. %.3f)",
		"best effort", overTimed[len(overTimed)/2], overTimed[len(overTimed)/4], overTimed[3*len(overTimed)/4])
	med := ratios[2][len(ratios[2])/2]
	b.ReportMetric(float64(took[0].Microseconds())/n, "net-µs/dial")
	b.ReportMetric(float64(took[2].Microseconds())/n, "best-µs/dial")
	b.ReportMetric(med, "best/net")
	b.ReportMetric(overTimed[len(overTimed)/2], "best/timed")
	testnet.CheckTarget(b, "best-effort dial / net.Dial, a destination reachable directly (median of rounds)", med, "<=", 1.05)
}

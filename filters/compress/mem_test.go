package compress

import (
	"net"
	"runtime"
	"testing"

	"github.com/vlink-dev/vlink/filters/identity"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// idleHeap opens n connection pairs over loopback TCP, wraps them with f
// (nil for plain TCP), runs one exchange on each (a compressible block and
// a small message each way, so the pools have been used), and returns the
// live heap per idle pair once every pool has been emptied by the GC.
func idleHeap(tb testing.TB, n int, f layer.Filter) float64 {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	block, small := textCorpus(100<<10), []byte("hello")
	buf := make([]byte, len(block))
	conns := make([]net.Conn, 0, 2*n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	heap := func() uint64 {
		runtime.GC()
		runtime.GC() // the second one empties the pools' victim caches
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for range n {
		a, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
		if err != nil {
			tb.Fatal(err)
		}
		b, err := ln.AcceptTCP()
		if err != nil {
			tb.Fatal(err)
		}
		var c, s net.Conn = a, b
		if f != nil {
			c, _ = f.Client(a)
			s, _ = f.Server(b)
		}
		conns = append(conns, c, s)
		for _, p := range [][2]net.Conn{{c, s}, {s, c}} {
			for _, msg := range [][]byte{block, small} {
				if _, err := p[0].Write(msg); err != nil {
					tb.Fatal(err)
				}
				// Read in small pieces, so decoded bytes wait in the conn.
				for got := 0; got < len(msg); {
					k, err := p[1].Read(buf[got:min(len(msg), got+1000)])
					if err != nil {
						tb.Fatal(err)
					}
					got += k
				}
			}
		}
	}
	after := heap()
	runtime.KeepAlive(conns)
	return float64(after-before) / float64(n)
}

// TestIdleMemory checks that an idle connection holds no buffer and no
// codec state: 1,000 idle pairs cost next to what plain TCP pairs cost
// (auto: plus its controller's estimates).
func TestIdleMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2,000 connections")
	}
	const pairs = 1000
	base := idleHeap(t, pairs, nil)
	t.Logf("tcp: %.0f bytes per idle pair", base)
	for _, name := range append([]string{"identity", "adaptive"}, codecNames...) {
		var f layer.Filter = identity.Filter{}
		switch name {
		case "identity":
		case "adaptive":
			f = mustAuto(t, AutoConfig{})
		default:
			f = mustNew(t, name, defaultLevel(name))
		}
		idleHeap(t, 10, f) // build the shared codec state first
		per := idleHeap(t, pairs, f)
		t.Logf("%s: %.0f bytes per idle pair (%+.0f over tcp)", name, per, per-base)
		// auto keeps what its controller learned (estimates, the tcp_info
		// buffer) on each side that has written: about 1 KiB more.
		limit := 2048.0
		if name == "adaptive" {
			limit = 3072
		}
		if per-base > limit {
			t.Errorf("%s: %.0f bytes per idle pair over tcp's %.0f", name, per-base, base)
		}
	}
}

// BenchmarkIdleMemory reports the heap an idle pair of connections holds,
// for plain TCP and each filter.
func BenchmarkIdleMemory(b *testing.B) {
	for _, name := range append([]string{"tcp", "identity", "adaptive"}, codecNames...) {
		b.Run(name, func(b *testing.B) {
			var f layer.Filter
			switch name {
			case "tcp":
			case "identity":
				f = identity.Filter{}
			case "adaptive":
				f = mustAuto(b, AutoConfig{})
			default:
				f = mustNew(b, name, defaultLevel(name))
			}
			idleHeap(b, 10, f) // build the shared codec state first
			var per float64
			for range b.N {
				per = idleHeap(b, 1000, f)
			}
			b.ReportMetric(per, "B/pair")
			b.ReportMetric(0, "ns/op")
		})
	}
}

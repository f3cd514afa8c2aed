package mux

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// BenchmarkStreamPaired sends 1 MiB writes to a sink through a mux stream
// and through a plain TCP connection to the same listener, taking turns
// within every iteration so the machine's noise falls on both alike. It
// reports each one's rate and their ratio: what the stream's send buffer
// (one copy per chunk, see stream) and smux's framing cost in bulk.
func BenchmarkStreamPaired(b *testing.B) {
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	testnet.Serve(b, l, func(c net.Conn) { io.Copy(io.Discard, c) })

	var cs [2]net.Conn
	for i, s := range []string{"tcp", "mux"} {
		d := &vlink.Dialer{Stack: vlink.MustParse(s)}
		defer d.Close()
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}

	buf := make([]byte, 1<<20)
	const chunks = 32 // per turn
	var took [2]time.Duration
	turn := 0
	for b.Loop() {
		turn++ // alternate who goes first
		for k := range cs {
			i := (k + turn) % 2
			start := time.Now()
			for range chunks {
				if _, err := cs[i].Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			took[i] += time.Since(start)
		}
	}
	mb := float64(b.N*chunks*len(buf)) / 1e6
	b.ReportMetric(mb/took[0].Seconds(), "tcp-MB/s")
	b.ReportMetric(mb/took[1].Seconds(), "mux-MB/s")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "mux/tcp")
}

package netconn

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// BenchmarkRelay measures one-way throughput client -> relay -> server
// over loopback TCP, for Relay's paths and, in the same run, the
// baselines: io.Copy both ways and a naive read/write loop with a 32 KiB
// buffer. The client and the server run in the same process, so the
// cpu-ms/GiB metric (the whole process's CPU time per GiB relayed, on
// Unix) includes theirs: the same for every variant.
func BenchmarkRelay(b *testing.B) {
	const chunk = 1 << 20
	type pairFunc func(a, c net.Conn, wg *sync.WaitGroup)
	both := func(cp func(dst, src net.Conn)) pairFunc {
		return func(a, c net.Conn, wg *sync.WaitGroup) {
			wg.Add(2)
			go func() { defer wg.Done(); cp(c, a); c.Close() }()
			go func() { defer wg.Done(); cp(a, c); a.Close() }()
		}
	}
	for _, bm := range []struct {
		name  string
		wrapB wrap
		relay pairFunc
	}{
		{"Relay/zerocopy", asIs, func(a, c net.Conn, wg *sync.WaitGroup) {
			wg.Add(1)
			go func() { defer wg.Done(); Relay(a, c) }()
		}},
		{"Relay/poll", asHidden, func(a, c net.Conn, wg *sync.WaitGroup) {
			wg.Add(1)
			go func() { defer wg.Done(); Relay(a, c) }()
		}},
		{"baseline/io.Copy", asIs, both(func(dst, src net.Conn) { io.Copy(dst, src) })},
		{"baseline/naive-32KiB", asIs, both(func(dst, src net.Conn) { naiveCopy(hidden{dst}, hidden{src}) })},
	} {
		b.Run(bm.name, func(b *testing.B) {
			front, back := listen(b), listen(b)
			client, a := connect(b, front)
			c, server := connect(b, back)
			front.Close()
			back.Close()
			var wg sync.WaitGroup
			bm.relay(a, bm.wrapB(c), &wg)
			got := make(chan int64, 1)
			go func() {
				buf := make([]byte, 256<<10)
				var n int64
				for {
					m, err := server.Read(buf)
					n += int64(m)
					if err != nil {
						got <- n
						return
					}
				}
			}()
			data := testnet.RandomBytes(chunk, 1)
			b.SetBytes(chunk)
			b.ResetTimer()
			cpu0 := processCPU()
			for range b.N {
				if _, err := client.Write(data); err != nil {
					b.Fatal(err)
				}
			}
			client.(*net.TCPConn).CloseWrite()
			if n := <-got; n != int64(b.N)*chunk {
				b.Fatalf("server received %d bytes, want %d", n, int64(b.N)*chunk)
			}
			b.StopTimer()
			if cpu := processCPU() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Milliseconds())/(float64(b.N)*chunk/(1<<30)), "cpu-ms/GiB")
			}
			client.Close()
			server.Close()
			wg.Wait()
		})
	}
}

// naiveCopy is the baseline copy loop: its own 32 KiB buffer, held for
// the connection's lifetime.
func naiveCopy(dst io.Writer, src io.Reader) (n int64, err error) {
	buf := make([]byte, 32<<10)
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// sinkServer accepts connections and, for each, reads to EOF and answers
// the byte count (8 bytes, big endian): a client knows that everything
// it sent arrived.
type sinkServer struct {
	l  net.Listener
	wg sync.WaitGroup
}

func startSink(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &sinkServer{l: l}
	s.wg.Add(1)
	go s.serve()
	tb.Cleanup(func() { l.Close(); s.wg.Wait() })
	return l.Addr().String()
}

func (s *sinkServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			buf := make([]byte, 256<<10)
			var n int64
			for {
				m, err := c.Read(buf)
				n += int64(m)
				if err != nil {
					if errors.Is(err, io.EOF) {
						c.Write(binary.BigEndian.AppendUint64(nil, uint64(n)))
					}
					return
				}
			}
		}()
	}
}

// push sends data to a sink through addr and waits for the sink's count.
func push(tb testing.TB, addr string, data []byte) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write(data); err != nil {
		tb.Fatalf("push through %s: %v", addr, err)
	}
	c.(*net.TCPConn).CloseWrite()
	var count [8]byte
	if _, err := io.ReadFull(c, count[:]); err != nil {
		tb.Fatalf("push through %s: reading the count: %v", addr, err)
	}
	if n := binary.BigEndian.Uint64(count[:]); n != uint64(len(data)) {
		tb.Fatalf("push through %s: the sink got %d bytes, sent %d", addr, n, len(data))
	}
}

// BenchmarkForward pushes 32 MiB (half log text, half random) per
// operation from this process to a sink in this process, through a relay
// process: socat, vlink tunnel over the plain stack (the kernel's
// zero-copy path, splice(2)), or vlink tunnel -> vlink serve over a
// compressing stack. Each operation is paired with one straight to the
// sink, outside the timer: direct-MB/s is that baseline and x-direct the
// throughput ratio, from the same run.
func BenchmarkForward(b *testing.B) {
	data := genData(32<<20, 7)
	sink := startSink(b)
	for _, tc := range []struct {
		name  string
		needs []string
		setup func(b *testing.B) string
	}{
		{"socat", []string{"socat"}, func(b *testing.B) string {
			port := realserver.FreePort(b)
			p := startProc(b, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork,backlog=128", port), "TCP:"+sink)
			p.Ports = append(p.Ports, port)
			p.WaitListening(b, port)
			return fmt.Sprintf("127.0.0.1:%d", port)
		}},
		{"tunnel-tcp", nil, func(b *testing.B) string {
			_, addr := startVLink(b, "tunnel", "--to", sink, "--stack", "tcp")
			return addr
		}},
		{"tunnel-zstd-serve", nil, func(b *testing.B) string {
			_, gw := startVLink(b, "serve", "--target", sink)
			_, addr := startVLink(b, "tunnel", "--to", gw, "--stack", "zstd")
			return addr
		}},
		{"tunnel-lz4-serve", nil, func(b *testing.B) string {
			_, gw := startVLink(b, "serve", "--target", sink)
			_, addr := startVLink(b, "tunnel", "--to", gw, "--stack", "lz4")
			return addr
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			testenv.Programs(b, tc.needs...)
			addr := tc.setup(b)
			push(b, addr, data[:1<<20]) // warm up
			push(b, sink, data[:1<<20])
			b.SetBytes(int64(len(data)))
			var direct time.Duration
			b.ResetTimer()
			for range b.N {
				push(b, addr, data)
				b.StopTimer()
				start := time.Now()
				push(b, sink, data)
				direct += time.Since(start)
				b.StartTimer()
			}
			b.StopTimer()
			total := float64(b.N) * float64(len(data)) / 1e6
			b.ReportMetric(total/direct.Seconds(), "direct-MB/s")
			b.ReportMetric(direct.Seconds()/b.Elapsed().Seconds(), "x-direct")
		})
	}
}

// BenchmarkIdleConns measures what an idle connection costs vlink tunnel
// and vlink serve: it opens IDLE_CONNS connections (default 10000), each
// exchanging a few bytes with an echo server so that every layer is set
// up, waits for them to be idle, and reports the growth of each process's
// resident memory (VmRSS) per connection. The baseline, measured in the
// same run, is a tunnel over the plain stack straight to the echo server.
//
// Every process needs two descriptors per connection: the benchmark
// raises RLIMIT_NOFILE (as root), and if the hard limit cannot be raised
// it opens as many connections as the limit allows and says so.
func BenchmarkIdleConns(b *testing.B) {
	n := 10000
	if s := os.Getenv("IDLE_CONNS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n <= 0 {
			b.Fatalf("IDLE_CONNS=%q: want a positive number", s)
		}
	}
	n = raiseNofile(b, n)
	settle := 5 * time.Second
	if s := os.Getenv("IDLE_SETTLE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("IDLE_SETTLE=%q: %v", s, err)
		}
		settle = d
	}
	echo := startEcho(b)

	for range b.N {
		// The stack under test: tunnel -> serve -> echo.
		serve, gw := startVLink(b, "serve", "--target", echo)
		tun, addr := startVLink(b, "tunnel", "--to", gw, "--stack", "zstd")
		m := measureIdle(b, addr, n, settle, tun, serve)
		tun.Stop(b)
		serve.Stop(b)

		// The baseline: a plain tunnel.
		plain, paddr := startVLink(b, "tunnel", "--to", echo, "--stack", "tcp")
		base := measureIdle(b, paddr, n, settle, plain)
		plain.Stop(b)

		b.ReportMetric(float64(n), "conns")
		b.ReportMetric(m[0], "tunnel-KiB/conn")
		b.ReportMetric(m[1], "serve-KiB/conn")
		b.ReportMetric(base[0], "plain-tunnel-KiB/conn")
		testnet.CheckTarget(b, "tunnel --stack zstd, KiB per idle connection", m[0], "<=", 64)
		b.Logf("%d idle connections: tunnel --stack zstd %.1f KiB/conn, serve %.1f KiB/conn; baseline tunnel --stack tcp %.1f KiB/conn",
			n, m[0], m[1], base[0])
	}
}

// raiseNofile makes room for n connections in this process and in the
// vlink processes it starts (which inherit the limit), and returns how
// many connections fit.
func raiseNofile(b *testing.B, n int) int {
	const spare = 128 // descriptors besides the connections: logs, pipes, epoll
	want := uint64(2*n + spare)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Max < want {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}); err == nil {
			return n
		}
		fit := int(lim.Max-spare) / 2
		b.Logf("RLIMIT_NOFILE hard limit %d cannot be raised here (needs CAP_SYS_RESOURCE): opening %d connections instead of %d", lim.Max, fit, n)
		n = fit
	}
	// Setting the limit ourselves also makes children inherit it: Go
	// restores the original soft limit in children only if the program
	// never set it.
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	return n
}

// startEcho runs an echo server in this process.
func startEcho(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	testnet.Serve(tb, l, func(c net.Conn) {
		// Not io.Copy(c, c): its zero-copy path would hold a pipe, two
		// more descriptors, per idle connection.
		buf := make([]byte, 512)
		for {
			n, err := c.Read(buf)
			if _, werr := c.Write(buf[:n]); err != nil || werr != nil {
				return
			}
		}
	})
	return l.Addr().String()
}

// measureIdle opens n connections to addr, each echoing a short message,
// waits settle, and returns the VmRSS growth of each process per
// connection, in KiB. It closes the connections before returning.
func measureIdle(b *testing.B, addr string, n int, settle time.Duration, procs ...*proc) []float64 {
	b.Helper()
	// One connection first, so that what is set up once per process
	// (pools, codec tables) is not counted per connection.
	conns := openEchoing(b, addr, 1)
	conns[0].Close()
	time.Sleep(time.Second)
	before := make([]int64, len(procs))
	for i, p := range procs {
		before[i] = testnet.RSS(b, p.Pid()) >> 10
	}
	start := time.Now()
	conns = openEchoing(b, addr, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	b.Logf("%d connections through %s set up in %v", n, procs[0].Name, time.Since(start).Round(time.Millisecond))
	time.Sleep(settle)
	per := make([]float64, len(procs))
	for i, p := range procs {
		if fds := testnet.OpenFDs(b, p.Pid()); fds < 2*n {
			b.Fatalf("%s holds %d descriptors, want at least %d for %d connections", p, fds, 2*n, n)
		}
		after := testnet.RSS(b, p.Pid()) >> 10
		per[i] = float64(after-before[i]) / float64(n)
		b.Logf("%s: VmRSS %d KiB before, %d KiB with %d idle connections", p, before[i], after, n)
	}
	return per
}

// openEchoing opens n connections to addr, 64 at a time; on each it sends
// a short message and waits for its echo.
func openEchoing(b *testing.B, addr string, n int) []net.Conn {
	b.Helper()
	conns := make([]net.Conn, n)
	var (
		mu      sync.Mutex
		firstEr error
		wg      sync.WaitGroup
		next    = make(chan int)
	)
	for range min(64, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := net.DialTimeout("tcp", addr, 30*time.Second)
				if err == nil {
					// 240 bytes of text: enough for a compressing layer to
					// run its codec rather than send the block raw.
					msg := bytes.Repeat(fmt.Appendf(nil, "hello %8d\n", i), 16)
					c.SetDeadline(time.Now().Add(30 * time.Second))
					got := make([]byte, len(msg))
					if _, err = c.Write(msg); err == nil {
						_, err = io.ReadFull(c, got)
					}
					if err == nil && !bytes.Equal(got, msg) {
						err = fmt.Errorf("echo %q, sent %q", got, msg)
					}
					c.SetDeadline(time.Time{})
				}
				mu.Lock()
				if err != nil && firstEr == nil {
					firstEr = fmt.Errorf("connection %d: %w", i, err)
				}
				conns[i] = c
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if firstEr != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		b.Fatal(firstEr)
	}
	return conns
}

// BenchmarkFwdChain pushes 32 MiB (half log text, half random) per
// operation through a route of two vlink serve nodes (vlink tunnel --via
// gw1,gw2: gw1 relays, gw2 mirrors the stack and forwards to the sink),
// and, in the same operation outside the timer, through one vlink serve
// hop with the same stack: x-one-hop is the two-hop throughput as a
// fraction of the one-hop one (the target is 0.7 or more).
func BenchmarkFwdChain(b *testing.B) {
	data := genData(32<<20, 7)
	sink := startSink(b)
	for _, stack := range []string{"tcp", "zstd"} {
		b.Run(stack, func(b *testing.B) {
			_, one := startVLink(b, "serve", "--allow", sink)
			_, oneTun := startVLink(b, "tunnel", "--to", sink, "--via", one, "--stack", stack)
			_, gw2 := startVLink(b, "serve", "--allow", sink)
			_, gw1 := startVLink(b, "serve", "--hop", gw2)
			_, twoTun := startVLink(b, "tunnel", "--to", sink, "--via", gw1+","+gw2, "--stack", stack)
			push(b, oneTun, data[:1<<20]) // warm up
			push(b, twoTun, data[:1<<20])
			b.SetBytes(int64(len(data)))
			var oneHop time.Duration
			b.ResetTimer()
			for range b.N {
				push(b, twoTun, data)
				b.StopTimer()
				start := time.Now()
				push(b, oneTun, data)
				oneHop += time.Since(start)
				b.StartTimer()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)*float64(len(data))/1e6/oneHop.Seconds(), "one-hop-MB/s")
			b.ReportMetric(oneHop.Seconds()/b.Elapsed().Seconds(), "x-one-hop")
		})
	}
}

//go:build linux

package shm

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// The two-process benchmark: a helper process (this test binary, run
// again) serves an echo and a sink over loopback TCP and over shm, and
// the benchmark measures both from this process, interleaved, in rounds:
//
//	pingpong  1-byte round trips
//	bulk      64 KiB writes into a sink that reads into 64 KiB
//
// Run: go test ./factories/shm -run '^$' -bench TwoProcess -benchtime 20x
// (20 rounds). It reports each median and the ratio shm/tcp, with CPU
// per GB of both processes for bulk. SHM_BENCH_BUSY=N runs N processes
// that spin on a core each for the whole benchmark: a busy machine,
// where a side that polls the ring takes the core its peer needs.
func BenchmarkTwoProcess(b *testing.B) {
	if n, _ := strconv.Atoi(os.Getenv("SHM_BENCH_BUSY")); n > 0 {
		for range n {
			hog := exec.Command(os.Args[0], "-test.run=^TestBenchHog$")
			hog.Env = append(os.Environ(), "SHM_BENCH_HOG=1")
			if err := hog.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() { hog.Process.Kill(); hog.Wait() }()
		}
		b.Logf("%d processes spin beside the benchmark", n)
	}
	dir := filepath.Join(b.TempDir(), "shm")
	f, err := New(Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	helper := exec.Command(os.Args[0], "-test.run=^TestBenchHelper$")
	helper.Env = append(os.Environ(), "SHM_BENCH_HELPER=1", "SHM_DIR="+dir)
	helper.Stderr = os.Stderr
	out, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { helper.Process.Kill(); helper.Wait() }()
	var echoTCP, sinkTCP, echoShm, sinkShm string
	if _, err := fmt.Fscan(out, &echoTCP, &sinkTCP, &echoShm, &sinkShm); err != nil {
		b.Fatalf("helper: %v", err)
	}
	dial := func(kind, addr string) net.Conn {
		var c net.Conn
		var err error
		if kind == "shm" {
			c, err = f.DialContext(context.Background(), "tcp", addr, nil)
		} else {
			c, err = net.Dial("tcp", addr)
		}
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	conns := map[string]net.Conn{
		"tcp-echo": dial("tcp", echoTCP), "tcp-sink": dial("tcp", sinkTCP),
		"shm-echo": dial("shm", echoShm), "shm-sink": dial("shm", sinkShm),
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	const pings, bulkBytes = 20000, 1 << 30
	buf := make([]byte, 64<<10)
	// pingpong also returns what the kernel's scheduler saw of both
	// processes per round trip: time on a core, time runnable but
	// waiting for one, and times run (about the wake-ups).
	pingpong := func(c net.Conn) (rtt time.Duration, sched schedStat) {
		one := buf[:1]
		s0 := readSchedStat(helper.Process.Pid).add(readSchedStat(os.Getpid()))
		start := time.Now()
		for range pings {
			c.Write(one)
			if _, err := io.ReadFull(c, one); err != nil {
				b.Fatal(err)
			}
		}
		rtt = time.Since(start) / pings
		s1 := readSchedStat(helper.Process.Pid).add(readSchedStat(os.Getpid()))
		return rtt, s1.sub(s0).per(pings)
	}
	bulk := func(c net.Conn) (gbps, cpuPerGB float64) {
		cpu0 := cpuTime(helper.Process.Pid) + cpuTime(os.Getpid())
		start := time.Now()
		for n := 0; n < bulkBytes; n += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		c.Write(nil)
		// The sink answers one byte per GiB received.
		if _, err := io.ReadFull(c, buf[:1]); err != nil {
			b.Fatal(err)
		}
		el := time.Since(start)
		cpu := cpuTime(helper.Process.Pid) + cpuTime(os.Getpid()) - cpu0
		return float64(bulkBytes) * 8 / el.Seconds() / 1e9, cpu.Seconds() / (float64(bulkBytes) / 1e9)
	}
	var ppRatio, bulkRatio []float64
	var ppT, ppS, bT, bS, cT, cS []float64
	schedOf := map[string][]schedStat{}
	b.ResetTimer()
	for i := range b.N {
		order := []string{"tcp", "shm"}
		if i%2 == 1 {
			order = []string{"shm", "tcp"}
		}
		pp, bk, cp := map[string]float64{}, map[string]float64{}, map[string]float64{}
		for _, k := range order {
			rtt, st := pingpong(conns[k+"-echo"])
			pp[k] = float64(rtt.Nanoseconds()) / 1e3
			schedOf[k] = append(schedOf[k], st)
		}
		for _, k := range order {
			bk[k], cp[k] = bulk(conns[k+"-sink"])
		}
		ppRatio = append(ppRatio, pp["shm"]/pp["tcp"])
		bulkRatio = append(bulkRatio, bk["shm"]/bk["tcp"])
		ppT, ppS, bT, bS, cT, cS = append(ppT, pp["tcp"]), append(ppS, pp["shm"]), append(bT, bk["tcp"]), append(bS, bk["shm"]), append(cT, cp["tcp"]), append(cS, cp["shm"])
	}
	b.StopTimer()
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	spread := func(v []float64) string { return fmt.Sprintf("%.2f..%.2f", slices.Min(v), slices.Max(v)) }
	b.ReportMetric(med(ppRatio), "rtt-shm/tcp")
	b.ReportMetric(med(bulkRatio), "bulk-shm/tcp")
	b.Logf("1-byte round trip: tcp %.2f µs (%s), shm %.2f µs (%s); shm/tcp median %.3f (%s); %d rounds",
		med(ppT), spread(ppT), med(ppS), spread(ppS), med(ppRatio), spread(ppRatio), b.N)
	b.Logf("64 KiB writes: tcp %.2f Gbit/s (%s), shm %.2f Gbit/s (%s); shm/tcp median %.3f (%s)",
		med(bT), spread(bT), med(bS), spread(bS), med(bulkRatio), spread(bulkRatio))
	b.Logf("CPU per GB, both processes: tcp %.2f s (%s), shm %.2f s (%s)", med(cT), spread(cT), med(cS), spread(cS))
	for _, k := range []string{"tcp", "shm"} {
		var run, wait, slices []float64
		for _, st := range schedOf[k] {
			run, wait, slices = append(run, st.run), append(wait, st.wait), append(slices, st.slices)
		}
		b.Logf("per round trip, both processes (schedstat): %s on a core %.2f µs, waiting for one %.2f µs (%s), %.2f runs",
			k, med(run), med(wait), spread(wait), med(slices))
	}
	target := func(what string, got float64, ok bool, bound string) {
		verdict := "met"
		if !ok {
			verdict = "MISSED"
		}
		b.Logf("  target %s %s: %.3f, %s", what, bound, got, verdict)
	}
	target("1-byte round trip shm/tcp", med(ppRatio), med(ppRatio) <= 1.0/3, "<= 1/3")
	target("bulk shm/tcp with 64 KiB writes", med(bulkRatio), med(bulkRatio) >= 1.5, ">= 1.5")
}

// cpuTime is the CPU time process pid has used.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime is the 14th
	// field of the line, stime the 15th, in clock ticks.
	i := slices.Index(b, ')')
	var f [13]string
	var utime, stime int64
	fmt.Sscan(string(b[i+2:]), &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &utime, &stime)
	return time.Duration(utime+stime) * time.Second / 100
}

// schedStat is what /proc/PID/task/*/schedstat says of a process's
// threads: µs on a core, µs runnable and waiting for one, and the number
// of times a thread was run.
type schedStat struct{ run, wait, slices float64 }

func readSchedStat(pid int) schedStat {
	var s schedStat
	paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var run, wait, n float64
		fmt.Sscan(string(b), &run, &wait, &n)
		s = s.add(schedStat{run / 1e3, wait / 1e3, n})
	}
	return s
}

func (s schedStat) add(t schedStat) schedStat {
	return schedStat{s.run + t.run, s.wait + t.wait, s.slices + t.slices}
}
func (s schedStat) sub(t schedStat) schedStat {
	return schedStat{s.run - t.run, s.wait - t.wait, s.slices - t.slices}
}
func (s schedStat) per(n int) schedStat {
	return schedStat{s.run / float64(n), s.wait / float64(n), s.slices / float64(n)}
}

// TestBenchHog is one of BenchmarkTwoProcess's busy processes: it spins
// until killed.
func TestBenchHog(t *testing.T) {
	if os.Getenv("SHM_BENCH_HOG") == "" {
		return
	}
	runtime.GOMAXPROCS(1)
	for x := uint64(1); ; x = x*6364136223846793005 + 1 {
		if x == 0 {
			fmt.Println(x)
		}
	}
}

// TestBenchHelper is BenchmarkTwoProcess's other process.
func TestBenchHelper(t *testing.T) {
	if os.Getenv("SHM_BENCH_HELPER") == "" {
		return
	}
	f, _ := New(Options{Dir: os.Getenv("SHM_DIR")})
	serve := func(l net.Listener, h func(net.Conn)) {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go h(c)
			}
		}()
	}
	echo := func(c net.Conn) { io.Copy(c, c) }
	sink := func(c net.Conn) {
		buf := make([]byte, 64<<10)
		var n int64
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n += int64(k)
			if n >= 1<<30 {
				n -= 1 << 30
				c.Write([]byte{1})
			}
		}
	}
	var addrs []string
	for _, h := range []func(net.Conn){echo, sink} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serve(l, h)
		addrs = append(addrs, l.Addr().String())
	}
	for _, h := range []func(net.Conn){echo, sink} {
		l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		serve(l, h)
		addrs = append(addrs, l.Addr().String())
	}
	fmt.Println(addrs[0], addrs[1], addrs[2], addrs[3])
	time.Sleep(time.Hour)
}

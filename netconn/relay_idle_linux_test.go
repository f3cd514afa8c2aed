package netconn

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// idleRelays is how many idle relays TestIdleRelayMemory holds per
// variant; VLINK_IDLE_RELAYS overrides it.
func idleRelays() int {
	if n, err := strconv.Atoi(os.Getenv("VLINK_IDLE_RELAYS")); err == nil && n > 0 {
		return n
	}
	return 1000
}

// idleVariants start one relay between a and b in the way they name.
var idleVariants = map[string]struct {
	start    func(a, b net.Conn, wg *sync.WaitGroup)
	extraFDs int // descriptors a relay may hold beyond its two sockets
}{
	// Relay between two TCP connections: the chunked zero-copy path
	// (splice(2)).
	"Relay": {func(a, b net.Conn, wg *sync.WaitGroup) {
		wg.Add(1)
		go func() { defer wg.Done(); Relay(a, b) }()
	}, 0},
	// The poll path both ways, as Relay uses it for a TCP source and a
	// destination it cannot copy to in the kernel (and on every Unix but
	// Linux).
	"poll": {func(a, b net.Conn, wg *sync.WaitGroup) {
		wg.Add(2)
		go func() { defer wg.Done(); pollCopy(b, a); b.Close() }()
		go func() { defer wg.Done(); pollCopy(a, b); a.Close() }()
	}, 0},
	// Baseline: io.Copy both ways, which takes the zero-copy path between
	// TCP connections but holds a pipe (two descriptors) per direction.
	"io.Copy": {func(a, b net.Conn, wg *sync.WaitGroup) {
		wg.Add(2)
		go func() { defer wg.Done(); io.Copy(b, a); b.Close() }()
		go func() { defer wg.Done(); io.Copy(a, b); a.Close() }()
	}, 4},
	// Baseline: a read/write loop with its own 32 KiB buffer.
	"naive": {func(a, b net.Conn, wg *sync.WaitGroup) {
		wg.Add(2)
		go func() { defer wg.Done(); naiveCopy(b, a); b.Close() }()
		go func() { defer wg.Done(); naiveCopy(a, b); a.Close() }()
	}, 0},
}

// settle lets the relays park and the garbage collector run until the
// descriptor count is stable: pipes the net package pooled for splice(2)
// are closed by cleanups that run after the collection that frees them.
func settle(t testing.TB) runtime.MemStats {
	time.Sleep(200 * time.Millisecond)
	for fds, i := -1, 0; i < 20; i++ {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
		n := testnet.OpenFDs(t, 0)
		if n == fds {
			break
		}
		fds = n
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// TestIdleRelayHelper is the relay process of TestIdleRelayMemory: it
// accepts VLINK_IDLE_RELAYS connections, relays each to the backend with
// one variant, and when told on stdin prints what the process grew by.
// Alone in its process, its RSS is the relays' total cost: sockets,
// goroutines, buffers.
func TestIdleRelayHelper(t *testing.T) {
	v, ok := idleVariants[os.Getenv("VLINK_IDLE_HELPER")]
	if !ok {
		t.Skip("skipping: helper process of TestIdleRelayMemory")
	}
	n := idleRelays()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if need := uint64((2+v.extraFDs)*n + 64); lim.Cur < need {
		fmt.Printf("toomany %d relays need %d descriptors, RLIMIT_NOFILE is %d\n", n, need, lim.Cur)
		return
	}
	front := listen(t)
	defer front.Close()
	ms0, fds0, g0, rss0 := settle(t), testnet.OpenFDs(t, 0), runtime.NumGoroutine(), testnet.RSS(t, 0)
	fmt.Printf("addr %s\n", front.Addr())

	var wg sync.WaitGroup
	as, bs := make([]net.Conn, n), make([]net.Conn, n)
	for i := range n {
		a, err := front.Accept()
		if err != nil {
			t.Fatal(err)
		}
		b, err := net.Dial("tcp", os.Getenv("VLINK_RELAY_BACKEND"))
		if err != nil {
			t.Fatal(err)
		}
		as[i], bs[i] = a, b
		v.start(a, b, &wg)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Scan() // the endpoints have pushed data through every relay
	ms1, fds1, g1, rss1 := settle(t), testnet.OpenFDs(t, 0), runtime.NumGoroutine(), testnet.RSS(t, 0)
	f := float64(n)
	fmt.Printf("figures %d %.0f %.0f %.2f %.2f\n", n,
		float64(int64(ms1.HeapInuse+ms1.StackInuse)-int64(ms0.HeapInuse+ms0.StackInuse))/f,
		float64(rss1-rss0)/f, float64(fds1-fds0-2*n)/f, float64(g1-g0)/f)
	in.Scan() // the endpoints have closed
	wg.Wait()
	for i := range n {
		as[i].Close()
		bs[i].Close()
	}
}

// TestIdleRelayMemory measures what an idle relayed connection costs the
// process that relays it: heap and stacks, RSS (both including the two
// sockets), extra descriptors and goroutines, for Relay and the
// baselines, each in a fresh process. The test itself holds the endpoints.
func TestIdleRelayMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in short mode: holds thousands of connections")
	}
	n := idleRelays()
	type figures struct{ heapStack, rss, fds, goroutines float64 }
	got := map[string]figures{}
	for _, variant := range []string{"Relay", "poll", "io.Copy", "naive"} {
		back := listen(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleRelayHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "VLINK_IDLE_HELPER="+variant, "VLINK_IDLE_RELAYS="+strconv.Itoa(n),
			"VLINK_RELAY_BACKEND="+back.Addr().String())
		cmd.Stderr = os.Stderr
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out := bufio.NewScanner(stdout)
		var addr string
		skipped := false
		for addr == "" && !skipped && out.Scan() {
			fmt.Sscanf(out.Text(), "addr %s", &addr)
			if strings.HasPrefix(out.Text(), "toomany") {
				if variant == "Relay" || variant == "poll" {
					// Checked below: not a baseline to do without.
					cmd.Process.Kill()
					cmd.Wait()
					back.Close()
					testenv.Missing(t, "needs more descriptors (ulimit -n): %s: %s", variant, strings.TrimPrefix(out.Text(), "toomany "))
				}
				t.Logf("%-8s skipped: %s", variant, out.Text())
				skipped = true
			}
		}
		if skipped || addr == "" {
			cmd.Wait()
			back.Close()
			if !skipped {
				t.Fatalf("%s helper did not start", variant)
			}
			continue
		}
		clients, servers := make([]net.Conn, n), make([]net.Conn, n)
		up, down := testnet.RandomBytes(64<<10, 1), testnet.RandomBytes(64<<10, 2)
		buf := make([]byte, len(up))
		for i := range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			s, err := back.Accept()
			if err != nil {
				t.Fatal(err)
			}
			clients[i], servers[i] = c, s
			// 64 KiB each way, so the relay has run its copy path and
			// touched its buffers before going idle.
			errc := make(chan error, 2)
			go func() { _, err := c.Write(up); errc <- err }()
			go func() { _, err := s.Write(down); errc <- err }()
			if _, err := io.ReadFull(s, buf); err != nil || !bytes.Equal(buf, up) {
				t.Fatalf("relay %d: upstream corrupt or %v", i, err)
			}
			if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, down) {
				t.Fatalf("relay %d: downstream corrupt or %v", i, err)
			}
			for range 2 {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
		}
		back.Close()
		fmt.Fprintln(stdin, "measure")
		var m figures
		var count int
		for out.Scan() {
			if _, err := fmt.Sscanf(out.Text(), "figures %d %f %f %f %f", &count, &m.heapStack, &m.rss, &m.fds, &m.goroutines); err == nil {
				break
			}
		}
		for i := range n {
			clients[i].Close()
			servers[i].Close()
		}
		fmt.Fprintln(stdin, "closed")
		io.Copy(io.Discard, stdout)
		if err := cmd.Wait(); err != nil || count != n {
			t.Fatalf("%s helper: %v, %d relays measured", variant, err, count)
		}
		got[variant] = m
		t.Logf("%-8s %d idle relays: heap+stacks %6.0f B, RSS %6.0f B, %.2f extra fds, %.2f goroutines per relayed connection",
			variant, n, m.heapStack, m.rss, m.fds, m.goroutines)
	}
	for _, v := range []string{"Relay", "poll"} {
		m, ok := got[v]
		if !ok || raceEnabled {
			continue
		}
		if m.rss > 64<<10 || m.heapStack > 64<<10 {
			t.Errorf("%s: %.0f B RSS, %.0f B heap+stacks per idle relayed connection, want at most 64 KiB", v, m.rss, m.heapStack)
		}
		if m.fds > 0.05 {
			t.Errorf("%s: %.2f extra descriptors per idle relay, want none (no pipe held)", v, m.fds)
		}
	}
	if r, b := got["Relay"], got["naive"]; r.rss > 0 && b.rss > 0 {
		t.Logf("naive/Relay: %.1fx the heap+stacks, %.1fx the RSS", b.heapStack/r.heapStack, b.rss/r.rss)
	}
}

package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// envCrashChild makes the test binary act as a lab owner that gets
// SIGKILLed (TestCrashCleanup).
const envCrashChild = "VLAB_TEST_CRASH_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envCrashChild) == "1" {
		crashChild()
		return
	}
	code := m.Run()
	if code == 0 {
		// Delay lines, exec's copiers and echo servers must all be gone.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "lab: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// crashChild brings a lab up, says its ID and waits to be killed.
func crashChild() {
	topo := pairTopo(Link{RTT: Duration(10 * time.Millisecond)})
	topo.Hosts = append(topo.Hosts, Host{Name: "c"})
	topo.Links = append(topo.Links, Link{A: "b", B: "c"})
	l, err := Up(context.Background(), topo)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	// A process in the lab, which must not survive its lab either.
	sleeper := l.Command("c", "sleep", "600")
	sleeper.SysProcAttr = nil // no Pdeathsig: only the lab's cleanup can end it
	if err := sleeper.Start(); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("up", l.ID(), sleeper.Process.Pid)
	select {}
}

// labNamespaces returns the namespaces of lab id.
func labNamespaces(t *testing.T, id string) []string {
	t.Helper()
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), Prefix+id+"-") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// rootLinks lists the devices of this process's namespace.
func rootLinks(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	sort.Strings(names)
	return names
}

func processGone(pid int) bool {
	_, zombie, err := procStart(pid)
	return err != nil || zombie
}

// TestUpDown brings a three-host topology up (a veth pair, a delay line,
// a firewall, routing through the middle host) and checks that Close
// leaves no namespace, device, descriptor, state file or process behind.
func TestUpDown(t *testing.T) {
	topo, _ := Profile("firewall")
	Require(t, topo.Programs()...)
	linksBefore, fdsBefore := rootLinks(t), testnet.OpenFDs(t, 0)
	l, err := Up(context.Background(), topo)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	want := []string{netnsName(l.ID(), "client"), netnsName(l.ID(), "fw"), netnsName(l.ID(), "server")}
	if got := labNamespaces(t, l.ID()); !slices.Equal(got, want) {
		t.Fatalf("namespaces %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(stateDir, l.ID()+".json")); err != nil {
		t.Fatalf("state file: %v", err)
	}
	infos, err := List()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(infos, func(i Info) bool { return i.ID == l.ID() })
	if i < 0 || !infos[i].Alive || infos[i].Host("fw") == nil || len(infos[i].Host("fw").Addrs) != 2 {
		t.Fatalf("List: %+v", infos)
	}
	// Do puts sockets in the host: its address exists only there.
	addr := l.Addr("client").String() + ":0"
	ln, err := l.Listen("client", "tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s in client: %v", addr, err)
	}
	ln.Close()
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("%s exists outside the lab", addr)
	}
	if err := l.Do("nohost", func() error { return nil }); !errors.Is(err, ErrUnknownHost) {
		t.Fatalf("Do on an unknown host: %v", err)
	}
	// A process left running in a host.
	sleeper := l.Command("server", "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	if fds := testnet.OpenFDs(t, 0); fds <= fdsBefore {
		t.Fatalf("%d descriptors open with the lab up, %d before: the delay line holds none?", fds, fdsBefore)
	}

	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	t.Logf("teardown took %v", time.Since(start))
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("the process left in the lab survived Close")
	}
	if got := labNamespaces(t, l.ID()); len(got) != 0 {
		t.Fatalf("namespaces left: %v", got)
	}
	if _, err := os.Stat(filepath.Join(stateDir, l.ID()+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left: %v", err)
	}
	if got := rootLinks(t); !slices.Equal(got, linksBefore) {
		t.Fatalf("devices of this namespace: %v, before: %v", got, linksBefore)
	}
	if fds := testnet.OpenFDs(t, 0); fds != fdsBefore {
		t.Fatalf("%d descriptors open after Close, %d before", fds, fdsBefore)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Do("client", func() error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
}

// TestSysctls: the topology's settings are in force in its hosts, and
// the middle host forwards.
func TestSysctls(t *testing.T) {
	topo, _ := Profile("firewall")
	topo.Hosts[2].Sysctls = map[string]string{"net.ipv4.tcp_rmem": "4096 65536 1048576"}
	l := New(t, topo)
	read := func(host, key string) string {
		var v string
		if err := l.Do(host, func() (err error) { v, err = readSysctl(key); return err }); err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(v), " ")
	}
	for key, want := range TCPSysctls {
		if got := read("client", key); got != want {
			t.Errorf("client: %s = %q, want %q", key, got, want)
		}
	}
	if got := read("server", "net.ipv4.tcp_rmem"); got != "4096 65536 1048576" {
		t.Errorf("server: the host's own tcp_rmem %q, want it over the topology's", got)
	}
	if read("fw", "net.ipv4.ip_forward") != "1" || read("client", "net.ipv4.ip_forward") != "0" {
		t.Error("only the middle host forwards")
	}
}

// udpEcho serves UDP echo in host and returns its address.
func udpEcho(t *testing.T, l *Lab, host string) string {
	t.Helper()
	pc, err := l.ListenPacket(host, "udp", l.Addr(host).String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return pc.LocalAddr().String()
}

// probeRTT sends n probes from host to an echo server, one at a time,
// and returns the round trips measured.
func probeRTT(t *testing.T, l *Lab, host, addr string, n int) []time.Duration {
	t.Helper()
	c, err := l.DialContext(context.Background(), host, "udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var rtts []time.Duration
	buf := make([]byte, 64)
	for i := 0; i < n; i++ {
		msg := binary.BigEndian.AppendUint32(nil, uint32(i))
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			k, err := c.Read(buf)
			if err != nil {
				t.Fatalf("probe %d: %v", i, err)
			}
			if k == 4 && binary.BigEndian.Uint32(buf) == uint32(i) {
				break
			}
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	return rtts
}

// TestRTT measures round trips through delay lines: never below the
// configured RTT, and not much above it; with jitter, spread within the
// bounds, and never reordered.
func TestRTT(t *testing.T) {
	topo := Topology{
		Hosts: []Host{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}, {Name: "e"}, {Name: "f"}},
		Links: []Link{
			{A: "a", B: "b", RTT: Duration(40 * time.Millisecond)},
			{A: "c", B: "d", RTT: Duration(20 * time.Millisecond), Jitter: Duration(4 * time.Millisecond)},
			{A: "e", B: "f", AtoB: &Shape{Delay: Duration(30 * time.Millisecond)}, BtoA: &Shape{Delay: Duration(2 * time.Millisecond)}},
		},
	}
	l := New(t, topo)
	// Tolerance above the configured RTT: the delay line's wake-ups and
	// a shared, noisy machine.
	const slack = 10 * time.Millisecond
	check := func(name string, rtts []time.Duration, lo, hi time.Duration) {
		t.Helper()
		minimum, median := rtts[0], rtts[len(rtts)/2]
		t.Logf("%s: min %v, median %v, max %v", name, minimum, median, rtts[len(rtts)-1])
		if minimum < lo {
			t.Errorf("%s: a round trip of %v, below %v", name, minimum, lo)
		}
		if median > hi+slack {
			t.Errorf("%s: median round trip %v, want at most %v", name, median, hi+slack)
		}
	}
	echoB := udpEcho(t, l, "b")
	check("40 ms", probeRTT(t, l, "a", echoB, 20), 40*time.Millisecond, 40*time.Millisecond)
	check("30+2 ms", probeRTT(t, l, "e", udpEcho(t, l, "f"), 20), 32*time.Millisecond, 32*time.Millisecond)
	// SetLink changes the delay of a running line.
	if err := l.SetLink(context.Background(), "b", "a", Shape{Delay: Duration(5 * time.Millisecond)}, Shape{Delay: Duration(10 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	check("after SetLink, 15 ms", probeRTT(t, l, "a", echoB, 10), 15*time.Millisecond, 15*time.Millisecond)
	jit := probeRTT(t, l, "c", udpEcho(t, l, "d"), 40)
	// ±4 ms each way, but FIFO: a packet never leaves before the one
	// ahead of it, so the low end is not quite reachable.
	check("20 ms ±4", jit, 12*time.Millisecond, 28*time.Millisecond)
	if spread := jit[len(jit)-1] - jit[0]; spread < time.Millisecond {
		t.Errorf("20 ms ±4: round trips spread over %v only", spread)
	}

	// A TCP handshake takes one round trip (15 ms since SetLink).
	ln, err := l.Listen("b", "tcp", l.Addr("b").String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The fastest of a few: one connect can lose its CPU to another job
	// of the shared machine for longer than the slack.
	took := time.Hour
	for range 5 {
		start := time.Now()
		c, err := l.DialContext(context.Background(), "a", "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		took = min(took, time.Since(start))
		c.Close()
	}
	if took < 15*time.Millisecond || took > 15*time.Millisecond+slack {
		t.Errorf("TCP connect took %v at best of 5, want about 15ms", took)
	}

	// Order: a burst across the jittery line arrives in sequence.
	pc, err := l.ListenPacket("d", "udp", l.Addr("d").String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// The default buffer holds 256 such datagrams (832 bytes of skb
	// each): a reader that lost its CPU for 20 ms would lose some.
	const burst = 300
	if err := setRcvbufForce(pc.(*net.UDPConn), burst*2048); err != nil {
		t.Fatal(err)
	}
	s, err := l.DialContext(context.Background(), "c", "udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range burst {
		s.Write(binary.BigEndian.AppendUint32(nil, uint32(i)))
		if i%50 == 49 {
			time.Sleep(time.Millisecond)
		}
	}
	buf := make([]byte, 16)
	last := -1
	for got := 0; got < burst; got++ {
		pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %d datagrams: %v", got, err)
		}
		seq := int(binary.BigEndian.Uint32(buf[:n]))
		if seq <= last {
			t.Fatalf("datagram %d arrived after %d: reordered", seq, last)
		}
		last = seq
	}
}

// TestLoss sends datagrams over a lossy direction and counts what
// arrives: the loss rate is about the one configured (a binomial bound),
// the other direction loses nothing, and the delay line's own count
// agrees. Then TCP carries data intact over a lossy line, which makes
// the delay line cut TCP super-packets around lost segments.
//
// Only the delay line may lose a datagram, so the test leaves the
// kernel no reason to: the sender waits for the line to have read each
// batch (the sending TUN device's queue never fills), and the receiving
// socket's buffer holds every datagram, read only once the line has
// written them all. (A receiver that had to keep up with the line lost
// datagrams to its socket buffer under -race: UDP RcvbufErrors in b,
// beyond the line's own losses.)
func TestLoss(t *testing.T) {
	topo := Topology{
		Seed:  1, // reproducible
		Hosts: []Host{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}},
		Links: []Link{
			{A: "a", B: "b", AtoB: &Shape{Loss: 0.05}, BtoA: &Shape{}},
			{A: "c", B: "d", RTT: Duration(2 * time.Millisecond), Loss: 0.01},
		},
	}
	l := New(t, topo)

	const n, p, batch = 4000, 0.05, 100
	pc, err := l.ListenPacket("b", "udp", l.Addr("b").String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// Room for all n datagrams (each costs its skb's truesize, under
	// 1 KiB here, not its 5 bytes); beyond net.core.rmem_max, so forced
	// (root has CAP_NET_ADMIN).
	if err := setRcvbufForce(pc.(*net.UDPConn), n*2048); err != nil {
		t.Fatal(err)
	}
	s, err := l.DialContext(context.Background(), "a", "udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		if _, err := s.Write([]byte("probe")); err != nil {
			t.Fatal(err)
		}
		if i%batch == batch-1 || i == n-1 {
			sent := uint64(i + 1)
			waitLine(t, l, 0, fmt.Sprintf("the line to read %d datagrams", sent), func(d DirStats) bool { return d.Packets >= sent })
		}
	}
	st := waitLine(t, l, 0, "the line to deliver or drop every datagram", func(d DirStats) bool {
		return d.Sent+d.Lost+d.Overflow+d.WriteErrors >= d.Packets
	})
	got := 0
	buf := make([]byte, 64)
	pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for uint64(got) < st.AtoB.Sent {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			t.Fatalf("received %d of the %d datagrams the line delivered (%v); b's UDP receive buffer errors: %s",
				got, st.AtoB.Sent, err, udpRcvbufErrors(l, "b"))
		}
		got++
	}
	pc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, _, err := pc.ReadFrom(buf); err == nil {
		t.Errorf("more datagrams arrived than the %d the line delivered", st.AtoB.Sent)
	}
	lost := n - got
	// mean 200, standard deviation 13.8: ±5 sd
	t.Logf("%d of %d datagrams lost (%.2f%%, configured %.0f%%)", lost, n, 100*float64(lost)/n, 100*p)
	if lost < 131 || lost > 269 {
		t.Errorf("%d of %d lost, want about %d", lost, n, int(n*p))
	}
	if st.AtoB.Lost != uint64(lost) || st.AtoB.Packets != n || st.AtoB.Overflow != 0 || st.AtoB.WriteErrors != 0 {
		t.Errorf("the delay line counted %d lost (%d overflow, %d write errors) of %d, the receiver missed %d of %d",
			st.AtoB.Lost, st.AtoB.Overflow, st.AtoB.WriteErrors, st.AtoB.Packets, lost, n)
	}
	if st.BtoA.Lost != 0 {
		t.Errorf("the lossless direction lost %d", st.BtoA.Lost)
	}

	// TCP through 1% loss each way.
	ln, err := l.Listen("d", "tcp", l.Addr("d").String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := make([]byte, 8<<20)
	rand.NewChaCha8([32]byte{1, 2}).Read(data)
	want := sha256.Sum256(data)
	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			res <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		n, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = n, err
		res <- r
	}()
	c, err := l.DialContext(context.Background(), "c", "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(60 * time.Second))
	start := time.Now()
	if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	r := <-res
	c.Close()
	if r.err != nil || r.n != int64(len(data)) || r.sum != want {
		t.Fatalf("received %d bytes (%v), sha256 match %v; sent %d", r.n, r.err, r.sum == want, len(data))
	}
	st = l.Stats()[1]
	t.Logf("8 MiB over 1%% loss in %v: %d segments in %d writes, %d lost",
		time.Since(start), st.AtoB.Packets, st.AtoB.Writes, st.AtoB.Lost)
	if st.AtoB.Lost == 0 {
		t.Error("no segment lost: the split path went untested")
	}
	if st.AtoB.Writes >= st.AtoB.Packets {
		t.Errorf("%d writes for %d segments: no super-packets", st.AtoB.Writes, st.AtoB.Packets)
	}
}

// waitLine waits until the counters of the lab's delay line k (its A
// to B direction) satisfy ok, and returns them; what says what it waits
// for, if it times out.
func waitLine(t *testing.T, l *Lab, k int, what string, ok func(DirStats) bool) LinkStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := l.Stats()[k]
		if ok(st.AtoB) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %+v", what, st.AtoB)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// setRcvbufForce sets c's receive buffer to size bytes (the kernel
// doubles it), past net.core.rmem_max.
func setRcvbufForce(c *net.UDPConn, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
	}); err != nil {
		return err
	}
	return serr
}

// udpRcvbufErrors returns host's UDP RcvbufErrors: datagrams its sockets'
// full buffers dropped.
func udpRcvbufErrors(l *Lab, host string) string {
	var v string
	err := l.Do(host, func() error {
		// thread-self: /proc/net is the namespace of the process's main
		// thread, not of this one.
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var names []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != "Udp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			if i := slices.Index(names, "RcvbufErrors"); i > 0 && i < len(f) {
				v = f[i]
			}
		}
		return nil
	})
	if err != nil || v == "" {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return v
}

// TestRate checks with iperf3 that rate limits hold, on a veth pair and
// on a delay line, and can be changed and removed on the fly.
//
// A limit's upper bound is checked strictly. Its lower bound says the
// machine carried the limit, which a loaded one may not: tbf's bucket
// holds a few milliseconds of tokens, the 64K queue of a veth pair drops
// what a late sender sends in bursts, and the delay line runs in this
// process, under -race too. So while each limit is measured, this
// process measures how late its timers fire, and the lower bound is
// checked only when their 99th percentile stays within the bucket's
// depth (burst/rate, 5 ms at 50 Mbit/s); otherwise the test logs why it
// is not. On a loaded machine a single TCP flow through a veth pair's
// limit fell to 0.7 of it while the shaper, measured with UDP, still
// carried 0.95: the machine, not the shaper, fell short.
func TestRate(t *testing.T) {
	Require(t, "iperf3", "tc")
	const rate = 50 * Mbit
	topo := Topology{
		Hosts: []Host{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}},
		Links: []Link{
			{A: "a", B: "b", Rate: rate},
			{A: "c", B: "d", Rate: rate, RTT: Duration(10 * time.Millisecond)},
		},
		Sysctls: TCPSysctls,
	}
	l := New(t, topo)
	// iperf runs client->server and returns the 99th percentile of this
	// process's timer lateness meanwhile.
	iperf := func(client, server string) (Iperf3Result, time.Duration) {
		t.Helper()
		stop := timerLateness()
		res, err := l.Iperf3(context.Background(), Iperf3{Client: client, Server: server, Time: 3 * time.Second, Args: []string{"-O", "1"}})
		late := stop()
		if err != nil {
			t.Fatal(err)
		}
		return res, late
	}
	// depth is tbf's bucket for a limit (tbfArgs: 1 ms at the rate, 32K
	// at least), in time.
	depth := func(limit Bitrate) time.Duration {
		return time.Duration(float64(max(limit.BytesPer(time.Millisecond), 32<<10)*8) / float64(limit) * float64(time.Second))
	}
	limited := func(what, client, server string, limit Bitrate) Iperf3Result {
		t.Helper()
		res, late := iperf(client, server)
		d := depth(limit)
		t.Logf("%s: %.1f Mbit/s (limit %v), %d retransmits; timers late %v at the 99th percentile (bucket %v)",
			what, res.Mbps(), limit, res.Retransmits, late.Round(10*time.Microsecond), d.Round(10*time.Microsecond))
		if res.BitsPerSecond > 1.05*float64(limit) {
			t.Errorf("%s: %.1f Mbit/s through a %v limit", what, res.Mbps(), limit)
		}
		switch {
		case late > d:
			t.Logf("%s: lower bound not checked: this machine ran timers up to %v late, more than the bucket's %v: it has not the headroom to show it now", what, late.Round(10*time.Microsecond), d.Round(10*time.Microsecond))
		case res.BitsPerSecond < 0.75*float64(limit):
			t.Errorf("%s: %.1f Mbit/s through a %v limit, timers late %v at most (99th percentile)", what, res.Mbps(), limit, late.Round(10*time.Microsecond))
		}
		return res
	}
	for _, res := range []Iperf3Result{limited("a->b", "a", "b", rate), limited("c->d", "c", "d", rate)} {
		if res.ClientCPU <= 0 || res.ServerCPU <= 0 {
			t.Errorf("no CPU time measured: %+v", res)
		}
	}
	// Change the rate on the fly, then remove it.
	s := Shape{Rate: 20 * Mbit, Delay: Duration(5 * time.Millisecond)}
	if err := l.SetLink(context.Background(), "d", "c", s, s); err != nil {
		t.Fatal(err)
	}
	limited("c->d after SetLink", "c", "d", s.Rate)
	s.Rate = 0
	if err := l.SetLink(context.Background(), "d", "c", s, s); err != nil {
		t.Fatal(err)
	}
	res, late := iperf("c", "d")
	t.Logf("c->d after SetLink rate 0: %.1f Mbit/s; timers late %v at the 99th percentile", res.Mbps(), late.Round(10*time.Microsecond))
	switch {
	case late > depth(rate):
		t.Logf("c->d after SetLink rate 0: not checked: timers ran up to %v late", late.Round(10*time.Microsecond))
	case res.BitsPerSecond < 2*float64(rate):
		t.Errorf("after SetLink to rate 0: %.1f Mbit/s, still limited", res.Mbps())
	}
	if err := l.SetLink(context.Background(), "a", "b", Shape{Delay: Duration(time.Millisecond)}, Shape{}); err == nil {
		t.Error("SetLink gave a veth pair a delay")
	}
	if err := l.SetLink(context.Background(), "a", "d", Shape{}, Shape{}); err == nil {
		t.Error("SetLink on hosts that have no link")
	}
}

// TestFlowRate checks with iperf3 that a flow cap holds each TCP
// connection to it in both directions while several connections share
// the link's rate, and that SetLink removes it.
func TestFlowRate(t *testing.T) {
	Require(t, "iperf3", "tc")
	const rate, flow = 100 * Mbit, 20 * Mbit
	topo := Topology{
		Hosts:   []Host{{Name: "a"}, {Name: "b"}},
		Links:   []Link{{A: "a", B: "b", Rate: rate, FlowRate: flow}},
		Sysctls: TCPSysctls,
	}
	l := New(t, topo)
	run := func(what string, streams int, reverse bool) float64 {
		t.Helper()
		stop := timerLateness()
		res, err := l.Iperf3(context.Background(), Iperf3{Client: "a", Server: "b", Streams: streams, Reverse: reverse,
			Time: 3 * time.Second, Args: []string{"-O", "1"}})
		late := stop()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.1f Mbit/s (link %v, each flow %v); timers late %v at the 99th percentile", what, res.Mbps(), rate, flow, late.Round(10*time.Microsecond))
		return res.BitsPerSecond
	}
	if got := run("one flow a->b", 1, false); got > 1.05*float64(flow) {
		t.Errorf("one flow: %.1f Mbit/s through a cap of %v per flow", got/1e6, flow)
	}
	// Four flows carry more than one cap: the cap is per flow, told apart
	// by a's ports in both directions. (A loaded machine may carry less
	// than 4 caps, never less than 2 unless the cap is not per flow.)
	for _, reverse := range []bool{false, true} {
		what := "four flows a->b"
		if reverse {
			what = "four flows b->a"
		}
		got := run(what, 4, reverse)
		if got < 2*float64(flow) {
			t.Errorf("%s: %.1f Mbit/s, not above two caps of %v: the cap is not per flow", what, got/1e6, flow)
		}
		if got > 1.05*float64(rate) {
			t.Errorf("%s: %.1f Mbit/s through a link of %v", what, got/1e6, rate)
		}
	}
	if err := l.SetLink(context.Background(), "a", "b", Shape{Rate: rate}, Shape{Rate: rate}); err != nil {
		t.Fatal(err)
	}
	if got := run("one flow after SetLink without the cap", 1, false); got < 2*float64(flow) {
		t.Errorf("after SetLink without a flow cap: one flow %.1f Mbit/s, still capped at %v", got/1e6, flow)
	}
	// From no shaping at all to a cap again.
	for _, s := range []Shape{{}, {Rate: rate, FlowRate: flow}} {
		if err := l.SetLink(context.Background(), "a", "b", s, s); err != nil {
			t.Fatalf("SetLink to %v: %v", s, err)
		}
	}
	if got := run("one flow after SetLink from no shaping to the cap", 1, false); got > 1.05*float64(flow) {
		t.Errorf("after SetLink from no shaping to a cap of %v per flow: one flow %.1f Mbit/s", flow, got/1e6)
	}
}

// timerLateness starts measuring how late this process's timers fire
// (1 ms sleeps, back to back); stop ends it and returns the 99th
// percentile.
func timerLateness() (stop func() time.Duration) {
	quit := make(chan struct{})
	done := make(chan time.Duration)
	go func() {
		var late []time.Duration
		for {
			select {
			case <-quit:
				slices.Sort(late)
				if len(late) == 0 {
					done <- 0
					return
				}
				done <- late[len(late)*99/100]
				return
			default:
			}
			start := time.Now()
			time.Sleep(time.Millisecond)
			late = append(late, time.Since(start)-time.Millisecond)
		}
	}()
	return func() time.Duration { close(quit); return <-done }
}

// TestFirewall: a host's firewall accepts new connections to its open
// port only, lets its own connections out and their replies in; a
// firewall host in the middle lets its trusted side out and nothing new
// in.
func TestFirewall(t *testing.T) {
	Require(t, "nft")
	topo := Topology{
		Hosts: []Host{
			{Name: "client"},
			{Name: "server", Firewall: &Firewall{Open: []string{"tcp/7001"}}},
			{Name: "fw", Firewall: &Firewall{Trust: []string{"client"}}},
			{Name: "far"},
		},
		Links: []Link{{A: "client", B: "server"}, {A: "client", B: "fw"}, {A: "fw", B: "far"}},
	}
	l := New(t, topo)
	serve := func(host, addr string) string {
		t.Helper()
		ln, err := l.Listen(host, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				io.Copy(c, c)
				c.Close()
			}
		}()
		t.Cleanup(func() { ln.Close(); <-done })
		return ln.Addr().String()
	}
	echo := func(from, addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		defer cancel()
		c, err := l.DialContext(ctx, from, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		msg := []byte("hello through the firewall")
		if _, err := c.Write(msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo %q", got)
		}
		return nil
	}
	srv := l.Addr("server").String()
	open := serve("server", srv+":7001")
	closed := serve("server", srv+":7002")
	if err := echo("client", open); err != nil {
		t.Errorf("client to the open port: %v", err)
	}
	if err := echo("client", closed); !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("client to a port the firewall does not open: %v, want a timeout (dropped)", err)
	}
	if err := echo("server", closed); err != nil {
		t.Errorf("the same port from the server itself: %v", err)
	}
	// The server's own connections go out and their replies come in.
	if err := echo("server", serve("client", l.Addr("client").String()+":0")); err != nil {
		t.Errorf("server to client (outbound, established replies): %v", err)
	}
	// Through fw: the trusted side out, nothing new in.
	if err := echo("client", serve("far", l.Addr("far").String()+":0")); err != nil {
		t.Errorf("client through fw to far: %v", err)
	}
	inside := serve("client", l.Addrs("client")[1].String()+":0")
	if err := echo("far", inside); !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("far through fw to client: %v, want a timeout (dropped)", err)
	}
}

// TestCrashCleanup: a process brings a lab up and is SIGKILLed; the lab
// is stale, and the next Up removes it with the process left in it.
func TestCrashCleanup(t *testing.T) {
	Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashChild+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, _ := bufio.NewReader(out).ReadString('\n')
	var id string
	var sleeper int
	if _, err := fmt.Sscanf(line, "up %s %d", &id, &sleeper); err != nil {
		t.Fatalf("child said %q", line)
	}
	if got := labNamespaces(t, id); len(got) != 3 {
		t.Fatalf("child's lab %s has namespaces %v", id, got)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	infos, _ := List()
	i := slices.IndexFunc(infos, func(i Info) bool { return i.ID == id })
	if i < 0 || infos[i].Alive {
		t.Fatalf("the killed owner's lab %s: %+v, want it listed as not alive", id, infos)
	}
	if processGone(sleeper) {
		t.Fatal("the process in the lab died with its owner; the test proves nothing")
	}
	l := New(t, pairTopo(Link{}))
	if got := labNamespaces(t, id); len(got) != 0 {
		t.Fatalf("after the next Up (%s), the dead owner's namespaces remain: %v", l.ID(), got)
	}
	if _, err := os.Stat(filepath.Join(stateDir, id+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file of the dead owner's lab: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !processGone(sleeper) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d, left in the dead owner's lab, still runs", sleeper)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentLabs brings several labs with the same host names up at
// once: nothing of one may collide with another, and each carries its
// own traffic.
func TestConcurrentLabs(t *testing.T) {
	Require(t)
	const n = 4
	labs := make([]*Lab, n)
	errs := make(chan error, n)
	for i := range n {
		go func() {
			topo := pairTopo(Link{})
			if i%2 == 1 {
				topo = pairTopo(Link{RTT: Duration(2 * time.Millisecond)})
			}
			l, err := Up(context.Background(), topo)
			labs[i] = l
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	defer func() {
		for _, l := range labs {
			if l != nil {
				if err := l.Close(); err != nil {
					t.Error(err)
				}
			}
		}
	}()
	if t.Failed() {
		return
	}
	for i, l := range labs {
		// Each lab's b answers with its own lab's ID.
		ln, err := l.Listen("b", "tcp", l.Addr("b").String()+":7000")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err == nil {
				c.Write([]byte(l.ID()))
				c.Close()
			}
		}()
		c, err := l.DialContext(context.Background(), "a", "tcp", l.Addr("b").String()+":7000")
		if err != nil {
			t.Fatalf("lab %d: %v", i, err)
		}
		got, _ := io.ReadAll(c)
		c.Close()
		ln.Close()
		if string(got) != l.ID() {
			t.Errorf("lab %s reached %q", l.ID(), got)
		}
	}
}

// TestFirewallNAT: a NAT host sends its inside's connections out from its
// own address; "masquerade" keeps their source ports, "random" does not;
// nothing new comes in.
func TestFirewallNAT(t *testing.T) {
	Require(t, "nft")
	for _, nat := range []string{"masquerade", "random"} {
		t.Run(nat, func(t *testing.T) {
			l := New(t, Topology{
				Hosts: []Host{{Name: "inside"}, {Name: "nat", Firewall: &Firewall{Trust: []string{"inside"}, NAT: nat}}, {Name: "far"}},
				Links: []Link{{A: "inside", B: "nat"}, {A: "nat", B: "far"}},
			})
			ln, err := l.Listen("far", "tcp", l.Addr("far").String()+":0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			seen := make(chan netip.AddrPort, 1)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					seen <- c.RemoteAddr().(*net.TCPAddr).AddrPort()
					c.Close()
				}
			}()
			kept := 0
			const conns = 4
			for i := 0; i < conns; i++ {
				c, err := l.DialContext(context.Background(), "inside", "tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				local := c.LocalAddr().(*net.TCPAddr).AddrPort()
				c.Close()
				from := <-seen
				if want := l.Addrs("nat")[1]; from.Addr() != want {
					t.Fatalf("far saw the connection from %v, want the NAT's outside address %v", from.Addr(), want)
				}
				if from.Port() == local.Port() {
					kept++
				}
			}
			if nat == "masquerade" && kept != conns || nat == "random" && kept == conns {
				t.Fatalf("%s: %d of %d connections kept their source port", nat, kept, conns)
			}
			// Nothing new comes in.
			in, err := l.Listen("inside", "tcp", l.Addr("inside").String()+":0")
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			d := l.Dialer("far")
			d.Timeout = 500 * time.Millisecond
			if c, err := d.DialContext(context.Background(), "tcp", in.Addr().String()); err == nil {
				c.Close()
				t.Fatal("far connected to the inside through the NAT")
			}
		})
	}
}

//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/lab"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// A reachCell is one cell of the firewall lab matrix: node a dials node
// b by name, each behind what its side's host (fwa, fwb) does, with the
// relay between the two sides.
type reachCell struct {
	name     string
	fwa, fwb *lab.Firewall // nil: a plain router
	path     string        // the path a's best-effort dial must take
}

var reachCells = []reachCell{
	{name: "a: b behind a firewall", fwb: &lab.Firewall{Trust: []string{"b"}}, path: "reverse"},
	{name: "c: b behind a NAT", fwb: &lab.Firewall{Trust: []string{"b"}, NAT: "masquerade"}, path: "reverse"},
	{name: "e: both behind firewalls", fwa: &lab.Firewall{Trust: []string{"a"}}, fwb: &lab.Firewall{Trust: []string{"b"}}, path: "splice"},
	{name: "f: both behind NATs", fwa: &lab.Firewall{Trust: []string{"a"}, NAT: "masquerade"}, fwb: &lab.Firewall{Trust: []string{"b"}, NAT: "masquerade"}, path: "splice"},
	{name: "g: both behind port-changing NATs", fwa: &lab.Firewall{Trust: []string{"a"}, NAT: "random"}, fwb: &lab.Firewall{Trust: []string{"b"}, NAT: "random"}, path: "relay"},
}

// TestReach is the firewall lab matrix. In each cell, real processes in
// network namespaces: vlink relay on the relay host; on b, behind fwb,
// vlink serve --node b exposing three socat servers on its loopback
// (echo, a file to download, sha256sum of an upload); on a, behind fwa,
// vlink socks --node a accepting reverse connections. Nothing can
// connect to b from outside (checked). A SOCKS client on a reaches
// b.vlink.alt:PORT: the first byte's round trip, 8 MiB down and 8 MiB up
// checked by SHA-256, and the path every connection took (from serve's
// log) are the cell's row. Then the relay is killed while a connection
// carries data: a relayed connection fails with a reset at the
// application, never a clean end; a reversed or spliced one carries on
// to its end, intact. A relay started again on the same address gets both nodes back
// by themselves, and a new connection works within 10 s. Every cell runs
// twice: members of a network with an owner (certificates, the relay
// holding no key; issue 37), then the key mode.
func TestReach(t *testing.T) {
	lab.Require(t, "nft", "socat")
	dir := t.TempDir()
	download := filepath.Join(dir, "download")
	if err := os.WriteFile(download, testnet.RandomBytes(8<<20, 31), 0o644); err != nil {
		t.Fatal(err)
	}
	var rows []string
	// Members (a network with an owner) first, the mode the guide
	// teaches; then the key mode.
	for _, auth := range []*reachAuth{memberAuth(t, dir), keyAuth(t, dir)} {
		for _, cell := range reachCells {
			t.Run(auth.mode+"/"+cell.name, func(t *testing.T) {
				rows = append(rows, fmt.Sprintf("%-8s ", auth.mode)+reachInLab(t, cell, auth, download))
			})
		}
	}
	t.Logf("firewall lab matrix (first byte: its round trip from the SOCKS connect on, the path's set-up included; again: the same on the next connection, once a learned the path; relay killed: what a connection carrying data saw; after the relay's restart: both nodes registered again, a new connection worked):\n%-8s %-34s %-8s %-12s %-12s %-20s %-14s %s\n%s",
		"mode", "cell", "path", "first byte", "again", "relay killed", "re-registered", "new conn. works",
		strings.Join(rows, "\n"))
}

// reachAuth is how the lab's relay and nodes prove themselves: the
// flags of each, by name.
type reachAuth struct {
	mode  string
	relay []string
	node  map[string][]string
}

var reachNodes = []string{"a", "a2", "a3", "b"}

// keyAuth: a network key on the relay, a key derived for each node.
func keyAuth(t *testing.T, dir string) *reachAuth {
	network := filepath.Join(dir, "network.key")
	if _, stderr, err := run(startTimeout, nil, vlinkBin, "key", "--out", network); err != nil {
		t.Fatalf("vlink key: %v\n%s", err, stderr)
	}
	a := &reachAuth{mode: "key", relay: []string{"--key-file", network}, node: map[string][]string{}}
	for _, n := range reachNodes {
		k := filepath.Join(dir, n+".key")
		if _, stderr, err := run(startTimeout, nil, vlinkBin, "key", "--node", n, "--key-file", network, "--out", k); err != nil {
			t.Fatalf("vlink key --node %s: %v\n%s", n, err, stderr)
		}
		a.node[n] = []string{"--node-key-file", k}
	}
	return a
}

// memberAuth: an owner, and each machine's own key and certificate.
func memberAuth(t *testing.T, dir string) *reachAuth {
	vlinkOut := func(args ...string) string {
		t.Helper()
		out, stderr, err := run(startTimeout, nil, vlinkBin, args...)
		if err != nil {
			t.Fatalf("vlink %v: %v\n%s", args, err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	owner := filepath.Join(dir, "owner.key")
	vlinkOut("owner", "init", "--out", owner)
	flags := func(name string, relay bool) []string {
		k, crt := filepath.Join(dir, name+".id"), filepath.Join(dir, name+".crt")
		vlinkOut("key", "--identity", "--out", k)
		args := []string{"cert", "sign", "--owner", owner, "--name", name, "--pub", vlinkOut("key", "--pub", k), "--out", crt}
		if relay {
			args = append(args, "--relay")
		}
		vlinkOut(args...)
		return []string{"--cert", crt, "--cert-key", k, "--owner", owner + ".pub"}
	}
	a := &reachAuth{mode: "member", relay: flags("relay", true), node: map[string][]string{}}
	for _, n := range reachNodes {
		a.node[n] = flags(n, false)
	}
	return a
}

// reachInLab runs one cell and returns its row of the matrix.
func reachInLab(t *testing.T, cell reachCell, auth *reachAuth, download string) string {
	l := lab.New(t, lab.Topology{
		Name: "reach",
		Hosts: []lab.Host{
			{Name: "a"}, {Name: "fwa", Firewall: cell.fwa}, {Name: "relay"}, {Name: "fwb", Firewall: cell.fwb}, {Name: "b"},
		},
		Links:   []lab.Link{{A: "a", B: "fwa"}, {A: "fwa", B: "relay"}, {A: "relay", B: "fwb"}, {A: "fwb", B: "b"}},
		Sysctls: lab.TCPSysctls,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	checkUnreachable(t, l, "a", "b", "fwb")
	if cell.fwa != nil {
		checkUnreachable(t, l, "b", "a", "fwa")
	}

	relayAddr := fmt.Sprintf("%s:7100", l.Addr("relay"))
	startRelay := func() *proc {
		p := labProc(t, l, "relay", vlinkBin, append([]string{"relay", "--listen", relayAddr,
			"--grace", "1s", "--log-level", "debug"}, auth.relay...)...)
		p.CleanExit = true
		p.WaitFor(t, listenAddrRE, startTimeout)
		return p
	}
	relay := startRelay()

	labServers(t, l, "b", "127.0.0.1", download) // on b's loopback only
	serve := labProc(t, l, "b", vlinkBin, append([]string{"serve", "--listen", "127.0.0.1:7000", "--grace", "1s", "--log-level", "debug",
		"--node", "b", "--relay", relayAddr, "--allow", "localhost:7300-7302"}, auth.node["b"]...)...)
	serve.CleanExit = true
	registered := regexp.MustCompile(`msg="control: registered" node=`)
	serve.WaitFor(t, registered, startTimeout)
	seen := relay.WaitFor(t, regexp.MustCompile(`msg="control: relay: registered" node=b "seen as"=(\S+)`), startTimeout)
	if cell.fwb != nil && cell.fwb.NAT != "" {
		// The relay sees b as the NAT's outside address, so b's
		// connection back must cross the NAT outbound.
		if want := l.Addrs("fwb")[0].String() + ":"; !strings.HasPrefix(seen[1], want) {
			t.Fatalf("the relay saw b at %s, want the NAT's address %s...", seen[1], want)
		}
	}

	const socksPort = 1080
	socksProc := labProc(t, l, "a", vlinkBin, append([]string{"socks", "--listen", fmt.Sprintf("127.0.0.1:%d", socksPort), "--stack", "zstd",
		"--grace", "1s", "--log-level", "debug", "--node", "a", "--relay", relayAddr,
		"--reverse-listen", fmt.Sprintf("%s:7200", l.Addr("a"))}, auth.node["a"]...)...)
	socksProc.CleanExit = true
	waitLabListening(t, l, socksProc, "a", socksPort)
	socksProc.WaitFor(t, registered, startTimeout)
	// The application: a SOCKS5 client on a, naming b.vlink.alt (vlink's
	// own client, which the factory tests run against dante).
	client, err := socks.New(socks.Options{Version: socks.V5, Proxy: fmt.Sprintf("127.0.0.1:%d", socksPort)})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(port int) (net.Conn, error) {
		return client.DialContext(ctx, "tcp", fmt.Sprintf("b.vlink.alt:%d", port), l.Dialer("a"))
	}
	dialB := func(port int) net.Conn {
		t.Helper()
		c, err := dial(port)
		if err != nil {
			t.Fatalf("SOCKS5 to b.vlink.alt:%d: %v\nsocks:\n%s", port, err, realserver.Tail(socksProc.Output(), 3000))
		}
		c.SetDeadline(time.Now().Add(time.Minute))
		return c
	}

	// The first byte's round trip, the set-up of the path included; and
	// again, once a has learned which path wins.
	firstByte := func() time.Duration {
		start := time.Now()
		c := dialB(7300)
		defer c.Close()
		one := make([]byte, 1)
		if _, err := c.Write([]byte{42}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil || one[0] != 42 {
			t.Fatalf("first byte: %v (got %v)", err, one)
		}
		return time.Since(start)
	}
	first, again := firstByte(), firstByte()

	bothWays(t, dialB, download)

	// The relay dies while a connection carries data.
	killed := relayKilled(t, cell.path, dialB(7300), relay)

	startRelay() // stopped by the test's cleanup
	restarted := time.Now()
	waitCount(t, serve, registered, 2, 15*time.Second)
	waitCount(t, socksProc, registered, 2, 15*time.Second)
	reregistered := time.Since(restarted)
	var back time.Duration
	small := testnet.RandomBytes(64<<10, 33)
	for attempt := 1; ; attempt++ {
		c, err := dial(7300)
		var got []byte
		if err == nil {
			c.SetDeadline(time.Now().Add(3 * time.Second))
			got, err = echoOn(c, small)
			c.Close()
		}
		if err == nil && testnet.Sum(got) == testnet.Sum(small) {
			back = time.Since(restarted)
			break
		}
		if time.Since(restarted) > 10*time.Second {
			t.Fatalf("no working connection 10 s after the relay restarted (last: %v, %d bytes back); socks:\n%s\nserve:\n%s",
				err, len(got), realserver.Tail(socksProc.Output(), 3000), realserver.Tail(serve.Output(), 3000))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Every connection to b took the cell's path.
	paths := regexp.MustCompile(`msg="control: connection from a node" from=a port=\d+ path=(\w+)`).FindAllStringSubmatch(serve.Output(), -1)
	if len(paths) < 5 {
		t.Fatalf("serve logged %d connections from a, want at least 5:\n%s", len(paths), realserver.Tail(serve.Output(), 3000))
	}
	for _, p := range paths {
		if p[1] != cell.path {
			t.Fatalf("a connection came by %s, want %s:\n%s", p[1], cell.path, realserver.Tail(serve.Output(), 3000))
		}
	}

	if cell.fwa != nil {
		strictDial(t, l, auth, relayAddr, "reverse:fallback=false", "a2", 7202,
			`unreachable \(reverse: could not connect back to a2 at `)
	}
	if cell.fwa != nil && cell.fwa.NAT == "random" {
		strictDial(t, l, auth, relayAddr, "splice:fallback=false", "a3", 7203,
			`behind a NAT or proxy that changes ports`)
	}
	return fmt.Sprintf("%-34s %-8s %-12v %-12v %-20s %-14v %v", cell.name, cell.path, first.Round(100*time.Microsecond), again.Round(100*time.Microsecond), killed,
		reregistered.Round(time.Millisecond), back.Round(time.Millisecond))
}

// labServers starts the matrix's three socat servers on host, bound to
// bind: 7300 echoes, 7301 sends download, 7302 answers the SHA-256 of
// what it received.
func labServers(t *testing.T, l *lab.Lab, host, bind, download string) {
	t.Helper()
	for port, action := range map[int]string{7300: "EXEC:cat", 7301: "OPEN:" + download + ",rdonly", 7302: "EXEC:sha256sum"} {
		p := labProc(t, l, host, "socat", fmt.Sprintf("TCP-LISTEN:%d,bind=%s,reuseaddr,fork,backlog=128", port, bind), action)
		waitLabListening(t, l, p, host, port)
	}
}

// bothWays moves 8 MiB down (port 7301) and 8 MiB up (7302) through
// connections dial makes, and checks each by SHA-256.
func bothWays(t *testing.T, dial func(port int) net.Conn, download string) {
	t.Helper()
	want, _ := fileSum(t, download)
	c := dial(7301)
	got, err := io.ReadAll(c)
	c.Close()
	if err != nil || testnet.Sum(got) != want {
		t.Fatalf("download: %d bytes, sha256 %.16s (%v); want 8 MiB, %.16s", len(got), testnet.Sum(got), err, want)
	}
	up := testnet.RandomBytes(8<<20, 32)
	c = dial(7302)
	got, err = echoOn(c, up)
	c.Close()
	if sum := sha256.Sum256(up); err != nil || !strings.HasPrefix(string(got), hex.EncodeToString(sum[:])) {
		t.Fatalf("upload: the far sha256sum says %q (%v), want %x", got, err, sum)
	}
}

// waitLabListening waits until p listens on port in host, and fails at
// once if p exits first.
func waitLabListening(t testing.TB, l *lab.Lab, p *proc, host string, port int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := l.WaitListening(ctx, host, port); err != nil {
		t.Fatalf("%s: %v; output:\n%s", p, err, realserver.Tail(p.Output(), 3000))
	}
}

// checkUnreachable checks that from cannot connect to a port to's host
// listens on, though inside (to's own firewall) can.
func checkUnreachable(t *testing.T, l *lab.Lab, from, to, inside string) {
	t.Helper()
	probe := fmt.Sprintf("%s:7201", l.Addr(to))
	ln, err := l.Listen(to, "tcp", probe)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	d := l.Dialer(inside)
	d.Timeout = 3 * time.Second
	if c, err := d.DialContext(context.Background(), "tcp", probe); err != nil {
		t.Fatalf("%s (%s's own firewall) cannot connect to %s: %v", inside, to, probe, err)
	} else {
		c.Close()
	}
	d = l.Dialer(from)
	d.Timeout = 2 * time.Second
	if c, err := d.DialContext(context.Background(), "tcp", probe); err == nil {
		c.Close()
		t.Fatalf("%s connected to %s at %s directly: the firewall lets inbound connections through", from, to, probe)
	}
}

// relayKilled kills the relay while c (to b's echo server) carries
// data, and checks what the application sees, which depends on the
// path: a relayed connection must fail with a reset, never end cleanly;
// a reversed or spliced one must carry on, intact. It returns what
// happened, for the matrix.
func relayKilled(t *testing.T, path string, c net.Conn, relay *proc) string {
	t.Helper()
	defer c.Close()
	const before, total = 4 << 20, 16 << 20
	data := testnet.RandomBytes(total, 34)
	var (
		mu       sync.Mutex
		received []byte
		readErr  error
	)
	enough, readDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 64<<10)
		signalled := false
		for {
			n, err := c.Read(buf)
			mu.Lock()
			received = append(received, buf[:n]...)
			if len(received) >= before && !signalled {
				close(enough)
				signalled = true
			}
			mu.Unlock()
			if err != nil {
				mu.Lock()
				readErr = err
				mu.Unlock()
				return
			}
		}
	}()
	// The first 4 MiB, echoed back, before the kill. A relayed
	// connection gets no byte after it: a write into a dead connection
	// would turn a clean end into a reset, and only the read must tell.
	if _, err := c.Write(data[:before]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-enough:
	case <-readDone:
		t.Fatalf("the connection ended before the relay was killed: %v", readErr)
	}
	relay.Kill()
	<-relay.Done()
	direct := path != "relay"
	if direct {
		if _, err := c.Write(data[before:]); err != nil {
			t.Fatalf("writing on the %s connection after the relay died: %v", path, err)
		}
		c.(*net.TCPConn).CloseWrite()
	}
	<-readDone
	mu.Lock()
	defer mu.Unlock()
	switch {
	case direct && readErr == io.EOF && len(received) == total && testnet.Sum(received) == testnet.Sum(data):
		return "carried on, intact"
	case direct:
		t.Fatalf("the %s connection after the relay died: %d of %d bytes echoed, then %v", path, len(received), total, readErr)
	case readErr == io.EOF:
		t.Fatalf("the application saw a clean end of stream after %d of %d bytes: a cut looked like a complete transfer", len(received), before)
	case isTimeout(readErr):
		t.Fatalf("the application saw nothing for a minute after the relay died")
	case !isReset(readErr):
		t.Fatalf("the application saw %v, want a reset", readErr)
	}
	return "reset"
}

// strictDial: a tunnel on a, node name, whose stack's factory forbids
// the relay, cannot reach b by the one path it allows: its client sees a
// reset within the path's bound, and the tunnel says why (the regexp
// why).
func strictDial(t *testing.T, l *lab.Lab, auth *reachAuth, relayAddr, factory, name string, port int, why string) {
	t.Helper()
	listen := fmt.Sprintf("127.0.0.1:%d", port+1000)
	tunnel := labProc(t, l, "a", vlinkBin, append([]string{"tunnel", "--listen", listen, "--to", "b.vlink.alt:7300",
		"--stack", "zstd+" + factory, "--node", name, "--relay", relayAddr,
		"--reverse-listen", fmt.Sprintf("%s:%d", l.Addr("a"), port)}, auth.node[name]...)...)
	tunnel.CleanExit = true
	// Registered, then listening: the client connects once both are.
	tunnel.WaitFor(t, regexp.MustCompile(`msg="control: registered"`), startTimeout)
	tunnel.WaitFor(t, listenAddrRE, startTimeout)
	got, err := exchangeIn(context.Background(), l, "a", listen, []byte("hello"), 15*time.Second)
	if err == nil || !isReset(err) {
		t.Fatalf("a client of a tunnel (%s) that cannot reach b: %q, %v; want a reset", factory, got, err)
	}
	tunnel.WaitFor(t, regexp.MustCompile(`msg="cannot reach destination" .*`+why), startTimeout)
}

// exchangeIn is exchange from a lab host.
func exchangeIn(ctx context.Context, l *lab.Lab, host, addr string, data []byte, timeout time.Duration) ([]byte, error) {
	d := l.Dialer(host)
	d.Timeout = timeout
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	return echoOn(c, data)
}

// waitCount waits until re matches p's output n times.
func waitCount(t *testing.T, p *proc, re *regexp.Regexp, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(re.FindAllString(p.Output(), -1)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q %d times within %v; output:\n%s", p, re, n, timeout, realserver.Tail(p.Output(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

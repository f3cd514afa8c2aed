package preload

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "preload: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// builds holds the shim and the C test program, compiled once per run.
var builds struct {
	once           sync.Once
	dir            string
	shim, conntest string
	err            error
}

// needBuilds compiles the shim (warnings are errors) and conntest, or
// skips without a C compiler (fails in CI, where deps.sh installs gcc).
func needBuilds(t testing.TB) (shim, conntest string) {
	t.Helper()
	cc, err := compiler()
	if err != nil {
		testenv.Missing(t, "needs a C compiler: %v (Debian: gcc; %s installs it)", err, testenv.Install)
	}
	builds.once.Do(func() {
		if builds.dir, builds.err = os.MkdirTemp("", "vlink-preload-test-"); builds.err != nil {
			return
		}
		// The shim as vlink exec builds it, and again with -Werror and
		// more warnings, so a warning fails the tests.
		if builds.shim, builds.err = BuildShim(builds.dir); builds.err != nil {
			return
		}
		strict := append(append([]string{}, ShimFlags...), "-Werror", "-Wshadow", "-Wformat=2",
			"-o", filepath.Join(builds.dir, "strict.so"), "-x", "c", "-")
		cmd := exec.Command(cc, append(strict, ShimLibs...)...)
		cmd.Stdin = strings.NewReader(string(ShimSource))
		if out, err := cmd.CombinedOutput(); err != nil {
			builds.err = fmt.Errorf("the shim does not compile warning-free: %v\n%s", err, out)
			return
		}
		builds.conntest = filepath.Join(builds.dir, "conntest")
		out, err := exec.Command(cc, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-o", builds.conntest,
			"testdata/conntest.c", "-pthread").CombinedOutput()
		if err != nil {
			builds.err = fmt.Errorf("compiling testdata/conntest.c: %v\n%s", err, out)
		}
	})
	if builds.err != nil {
		t.Fatal(builds.err)
	}
	return builds.shim, builds.conntest
}

// echoServer echoes each connection until the peer half-closes, for 30
// seconds at most, until the test ends.
func echoServer(t testing.TB, network, addr string) string {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		testnet.Echo(c)
	})
	return l.Addr().String()
}

// gateway is a VLink listener standing in for vlink serve: it forwards to
// the target a dialer names, after mapping the lab's made-up addresses to
// loopback: 127.0.0.2, .3 and .5 to 127.0.0.1, fd00::1 to ::1, and
// NAME.far.test and NAME.fdfar.test to 127.0.0.1, except nosuch.*. Its
// lookups know the same names, all with both address families but
// v4only.far.test. It returns its address, and counts of the TCP
// connections it accepted and of the lookups it answered.
func gateway(t testing.TB) (addr string, conns, lookups *atomic.Int64) {
	t.Helper()
	mapTarget := func(target string) (string, error) {
		host, port, err := net.SplitHostPort(target)
		if err != nil {
			return "", err
		}
		switch {
		case strings.HasPrefix(host, "nosuch."):
			return "", fmt.Errorf("no such host %s", host)
		case strings.HasPrefix(host, "unreach."): // what a dial to a host with no route gets
			return "", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}
		case strings.HasPrefix(host, "silent."): // a host that drops SYNs, past the gateway's dial timeout
			return "", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
		case host == "127.0.0.2", host == "127.0.0.3", host == "127.0.0.5", strings.HasSuffix(host, ".far.test"), strings.HasSuffix(host, ".fdfar.test"):
			host = "127.0.0.1"
		case host == "fd00::1":
			host = "::1"
		}
		return net.JoinHostPort(host, port), nil
	}
	var mu sync.Mutex
	var targets []string
	lookups = new(atomic.Int64)
	lc := vlink.ListenConfig{
		// Plain refused, as by vlink serve without --target: a hello slowed past
		// the sniff timeout (a loaded machine, -race) must not be taken for a
		// plain connection, which would reach the handler with nothing admitted.
		Policy: vlink.Policy{Targets: []selector.Rule{{Action: selector.Direct}}, Datagrams: []selector.Rule{{Action: selector.Direct}},
			Plain: vlink.PlainRefuse},
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			mu.Lock()
			targets = append(targets, h.Target)
			mu.Unlock()
			if strings.HasPrefix(h.Target, "slow.") { // a host that answers its SYN late
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
				}
			}
			to, err := mapTarget(h.Target)
			if err == nil {
				network := "tcp"
				if h.Datagram {
					network = "udp"
				}
				var c net.Conn
				if c, err = (&net.Dialer{}).DialContext(ctx, network, to); err == nil {
					return c, nil
				}
			}
			return nil, vlink.TargetRefusal(err)
		},
		Lookup: func(ctx context.Context, h *vlink.Hello) (vlink.Families, error) {
			lookups.Add(1)
			host, _, _ := net.SplitHostPort(h.Target)
			switch {
			case strings.HasPrefix(host, "nosuch."):
				return 0, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			case host == "v4only.far.test":
				return vlink.FamilyIPv4, nil
			}
			return vlink.FamilyIPv4 | vlink.FamilyIPv6, nil
		},
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: inner}
	l, err := lc.NewListener(counted)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		vc := c.(*vlink.Conn)
		if vc.Hello().Datagram {
			dgram.Relay(vlink.DatagramConn(vc, nil), vc.Admitted().(net.Conn), 0)
			return
		}
		netconn.Relay(c, vc.Admitted().(net.Conn))
	})
	return l.Addr().String(), &counted.n, lookups
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// lab is an agent with rules covering every route, and its servers.
type lab struct {
	agent        *Agent
	shim, prog   string
	echo4, echo6 string // host:port of the echo servers
	port4, port6 string
	gw           string
	gwConns      *atomic.Int64 // TCP connections the gateway accepted
	gwLookups    *atomic.Int64 // lookups it answered
	logs         *testnet.Buffer
}

func newLab(t *testing.T) *lab {
	t.Helper()
	shim, prog := needBuilds(t)
	lb := &lab{shim: shim, prog: prog, logs: &testnet.Buffer{}}
	lb.echo4 = echoServer(t, "tcp4", "127.0.0.1:0")
	lb.echo6 = echoServer(t, "tcp6", "[::1]:0")
	_, lb.port4, _ = net.SplitHostPort(lb.echo4)
	_, lb.port6, _ = net.SplitHostPort(lb.echo6)
	lb.gw, lb.gwConns, lb.gwLookups = gateway(t)
	// The echo server again on 127.0.0.6, which a rule with tcp's options
	// and no gateway reaches: the agent connects by itself.
	echoServer(t, "tcp4", "127.0.0.6:"+lb.port4)
	rules := []selector.Rule{
		{Host: "127.0.0.6", Stack: "tcp:keepalive=7s"},   // the agent's own connect, a descriptor
		{Host: "127.0.0.2", Stack: "zstd", Via: lb.gw},   // relayed: the stack transforms the bytes
		{Host: "127.0.0.3", Stack: "tcp", Via: lb.gw},    // a descriptor: plain TCP after the hello
		{Host: "*.far.test", Stack: "zstd", Via: lb.gw},  // a name only the gateway resolves
		{Host: "*.fdfar.test", Stack: "tcp", Via: lb.gw}, // the same, as a descriptor
		{Host: "fd00::/8", Stack: "zstd", Via: lb.gw},
		{Host: "127.0.0.5", Stack: "mux+lz4", Via: lb.gw}, // streams of one session, with early data
		{Host: "127.0.0.4", Action: selector.Refuse},
		{Host: "*.refused.test", Action: selector.Refuse},
	}
	cfg, err := vlink.NewConfig(rules, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(lb.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if lb.agent, err = NewAgent(AgentConfig{Config: cfg, Logger: log, DialTimeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		lb.agent.Close()
		if t.Failed() {
			t.Logf("agent log:\n%s", lb.logs.String())
		}
	})
	return lb
}

// run runs conntest under the shim and returns its output.
func (lb *lab) run(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lb.prog, args...)
	cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+lb.shim), lb.agent.Env()...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// mustRun runs conntest and fails the test on a FAIL line or exit status.
func (lb *lab) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := lb.run(t, nil, args...)
	if err != nil || strings.Contains(out, "FAIL") {
		t.Fatalf("conntest %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestUDPRelayed sends datagrams on connected UDP sockets through every
// kind of route to a UDP echo server, with each call a UDP program makes:
// the bytes come back whole and from the address connected to.
func TestUDPRelayed(t *testing.T) {
	lb := newLab(t)
	echo := testnet.UDPEcho(t)
	port := strconv.Itoa(int(echo.Port()))
	for _, r := range []struct{ name, family, host string }{
		{"direct", "4", "127.0.0.1"},
		{"relay", "4", "127.0.0.2"},
		{"relay-mapped", "6", "127.0.0.2"}, // an IPv6 socket, an IPv4 destination
		{"plain-stack", "4", "127.0.0.3"},
		{"name", "4", "echo.far.test"},
		{"name-ipv6", "6", "echo.far.test"}, // a stand-in IPv6 address
		{"mux", "4", "127.0.0.5"},
	} {
		t.Run(r.name, func(t *testing.T) {
			out := lb.mustRun(t, "udpecho", r.family, r.host, port)
			if !strings.Contains(out, "ok udp echo") {
				t.Errorf("no %q in:\n%s", "ok udp echo", out)
			}
			// Unconnected, the same socket to this route and direct.
			out = lb.mustRun(t, "udpsendto", r.family, r.host, port)
			if !strings.Contains(out, "ok udp sendto") {
				t.Errorf("no %q in:\n%s", "ok udp sendto", out)
			}
		})
	}
	if !strings.Contains(lb.logs.String(), `msg="datagram relay" pid=`) {
		t.Errorf("no datagram went through the agent:\n%s", lb.logs.String())
	}
}

// TestUDPRefused: a datagram to a port where nothing listens on the far
// side fails the program's connected socket with ECONNREFUSED, as without
// the shim, though one datagram later: the far side's refusal closes the
// relay's port, and the program's next datagram bounces off it.
func TestUDPRefused(t *testing.T) {
	lb := newLab(t)
	port := strconv.Itoa(freeUDPPort(t))
	for _, tc := range []struct {
		host  string
		sends string
	}{
		{"127.0.0.1", "refused after 1 sends"},
		{"127.0.0.2", "refused after 2 sends"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			if out := lb.mustRun(t, "udprefused", tc.host, port); !strings.Contains(out, tc.sends) {
				t.Errorf("want %q, got:\n%s", tc.sends, out)
			}
		})
	}
}

// TestSendTimeout: a blocking connect with SO_SNDTIMEO returns EINPROGRESS
// when its time runs out before the far side answers, and the connection
// goes on, as the kernel's connect does; within the time it connects, or
// fails with the far side's errno.
func TestSendTimeout(t *testing.T) {
	lb := newLab(t)
	for _, tc := range []struct {
		name, host, ms string
		want           []string
	}{
		{"direct", "127.0.0.1", "2000", []string{"connect=connected after less than the timeout", "ok echo"}},
		{"answers-in-time", "echo.far.test", "2000", []string{"connect=connected after less than the timeout", "ok echo"}},
		{"answers-late", "slow.far.test", "300", []string{"connect=EINPROGRESS after the timeout", "later=connected", "ok echo"}},
		{"fails-in-time", "unreach.far.test", "2000", []string{"connect=EHOSTUNREACH after less than the timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := lb.run(t, nil, "sndtimeo", tc.host, lb.port4, tc.ms)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("no %q in:\n%s", w, out)
				}
			}
		})
	}
}

// TestUrgentByte: an urgent byte (MSG_OOB) does not cross vlink, and the
// shim says so, once, on the connections vlink carries; a direct one is
// left alone.
func TestUrgentByte(t *testing.T) {
	lb := newLab(t)
	const said = "an urgent byte (MSG_OOB) does not cross vlink"
	for _, tc := range []struct {
		host string
		says bool
	}{
		{"127.0.0.1", false},
		{"127.0.0.2", true},       // relayed by the agent
		{"echo.fdfar.test", true}, // the gateway's socket, passed
	} {
		t.Run(tc.host, func(t *testing.T) {
			// Direct, the echo server (Go's) gets the urgent byte and
			// stops at it: only the send is checked there.
			out, _ := lb.run(t, nil, "oob", tc.host, lb.port4)
			if !strings.Contains(out, "oob=sent") || tc.says && !strings.Contains(out, "ok echo") {
				t.Errorf("the urgent byte's send, then the echo: got\n%s", out)
			}
			if n := strings.Count(out, said); n != map[bool]int{true: 1, false: 0}[tc.says] {
				t.Errorf("said %d times %q:\n%s", n, said, out)
			}
		})
	}
}

// freeUDPPort returns a UDP port of 127.0.0.1 where nothing listens.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// routes are the ways a connect can go, each to the echo server.
func (lb *lab) routes() []struct{ name, host, port string } {
	return []struct{ name, host, port string }{
		{"direct", "127.0.0.1", lb.port4},
		{"direct-ipv6", "::1", lb.port6},
		{"relay", "127.0.0.2", lb.port4},
		{"relay-ipv6", "fd00::1", lb.port6},
		{"fd", "127.0.0.3", lb.port4},
		{"name-relay", "echo.far.test", lb.port4},
		{"name-fd", "echo.fdfar.test", lb.port4},
		{"mux", "127.0.0.5", lb.port4},
	}
}

func TestNonBlockingConnect(t *testing.T) {
	lb := newLab(t)
	// An IPv6 socket to an IPv4-mapped address waits on the IPv4 held
	// listener, and is woken over IPv4.
	mapped := struct{ name, host, port string }{"relay-mapped", "::ffff:127.0.0.2", lb.port4}
	for _, r := range append(lb.routes(), mapped) {
		t.Run(r.name, func(t *testing.T) {
			out := lb.mustRun(t, "nonblock", r.host, r.port)
			for _, want := range []string{"ok writable under epoll", "ok SO_ERROR 0", "ok connect after completion",
				"ok getpeername is the address connected to", "ok flags kept", "ok echo"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
		})
	}
}

// Every route leaves its trace in the agent's log: a test that passed
// because everything went direct would prove nothing. A direct connect to
// a real address leaves none: the shim decides it from the IP table.
func TestRoutesTaken(t *testing.T) {
	lb := newLab(t)
	lb.mustRun(t, "errno", "127.0.0.1", lb.port4)
	lb.mustRun(t, "nonblock", "127.0.0.1", lb.port4)
	if strings.Contains(lb.logs.String(), "to=127.0.0.1:"+lb.port4) {
		t.Errorf("the agent was asked about a direct connect:\n%s", lb.logs.String())
	}
	for _, tc := range []struct {
		host, port, log string
	}{
		{"127.0.0.2", lb.port4, `msg="relay done" .*to=127.0.0.2:` + lb.port4 + ` stack=zstd`},
		{"127.0.0.3", lb.port4, `msg="passed a descriptor" .*to=127.0.0.3:` + lb.port4 + ` stack=tcp`},
		{"127.0.0.6", lb.port4, `msg="direct, with the route's options" .*to=127.0.0.6:` + lb.port4 + ` stack="tcp:keepalive=7s"`},
		{"echo.far.test", lb.port4, `msg="relay done" .*to=echo.far.test:` + lb.port4 + ` stack=zstd`},
	} {
		lb.mustRun(t, "errno", tc.host, tc.port) // blocking
		lb.mustRun(t, "nonblock", tc.host, tc.port)
		re := regexp.MustCompile(tc.log)
		deadline := time.Now().Add(5 * time.Second)
		for !re.MatchString(lb.logs.String()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no %q in the agent's log", tc.host, tc.log)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func TestBlockingErrno(t *testing.T) {
	lb := newLab(t)
	closed := strconv.Itoa(testnet.RefusedPort(t))
	for _, tc := range []struct {
		name, host, port, want string
	}{
		{"direct-connected", "127.0.0.1", lb.port4, "errno=connected"},
		{"direct-refused", "127.0.0.1", closed, "errno=ECONNREFUSED"},
		{"relay-connected", "127.0.0.2", lb.port4, "errno=connected"},
		// The gateway's dial fails: its refusal carries the errno's class.
		{"relay-refused", "127.0.0.2", closed, "errno=ECONNREFUSED"},
		{"relay-unreachable", "unreach.far.test", lb.port4, "errno=EHOSTUNREACH"},
		{"relay-timed-out", "silent.far.test", lb.port4, "errno=ETIMEDOUT"},
		{"fd-refused", "127.0.0.3", closed, "errno=ECONNREFUSED"},
		{"plain-connected", "127.0.0.6", lb.port4, "errno=connected"},
		{"plain-refused", "127.0.0.6", closed, "errno=ECONNREFUSED"},
		// A mux stream sends its hello as early data; a blocking connect
		// still waits for the answer.
		{"mux-connected", "127.0.0.5", lb.port4, "errno=connected"},
		{"mux-refused", "127.0.0.5", closed, "errno=ECONNREFUSED"},
		{"rules-refuse", "127.0.0.4", lb.port4, "errno=EPERM"},
		{"rules-refuse-name", "x.refused.test", lb.port4, "errno=EPERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := lb.mustRun(t, "errno", tc.host, tc.port)
			if !strings.Contains(out, tc.want+"\n") {
				t.Errorf("want %s, got:\n%s", tc.want, out)
			}
		})
	}
}

// A gateway that is down gives the real errno of the dial to it.
func TestGatewayDown(t *testing.T) {
	shim, prog := needBuilds(t)
	closed := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.RefusedPort(t)))
	cfg, err := vlink.NewConfig(nil, selector.Rule{Stack: "zstd", Via: closed}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAgent(AgentConfig{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cmd := exec.Command(prog, "errno", "192.0.2.1", "80")
	cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+shim), a.Env()...)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "errno=ECONNREFUSED") {
		t.Errorf("want ECONNREFUSED from the gateway's port, got:\n%s", out)
	}
}

// A non-blocking connect through a stack returns at once, and reports the
// far side's failure where event loops look for it: SO_ERROR once the
// socket wakes, and a second connect.
func TestNonBlockingFailure(t *testing.T) {
	lb := newLab(t)
	closed := strconv.Itoa(testnet.RefusedPort(t))
	out := lb.mustRun(t, "nberrno", "127.0.0.1", closed)
	if !strings.Contains(out, "so_error=ECONNREFUSED") {
		t.Errorf("direct: want SO_ERROR ECONNREFUSED, got:\n%s", out)
	}
	for _, host := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.5"} { // relayed, descriptor, mux
		out = lb.mustRun(t, "nberrno", host, closed)
		if !strings.Contains(out, "so_error=ECONNREFUSED\n") {
			t.Errorf("%s: want SO_ERROR ECONNREFUSED, as direct, got:\n%s", host, out)
		}
		out = lb.mustRun(t, "nbconnect", host, closed)
		if !strings.Contains(out, "connect=ECONNREFUSED\n") {
			t.Errorf("%s: want a second connect's ECONNREFUSED, as direct, got:\n%s", host, out)
		}
	}
	out = lb.mustRun(t, "nberrno", "127.0.0.4", lb.port4)
	if !strings.Contains(out, "connect=EPERM") {
		t.Errorf("refused by the rules: want EPERM at once, got:\n%s", out)
	}
}

// A non-blocking connect through a stack completes when the far side does:
// not while the gateway keeps the dial waiting, and then with the dial's
// error. Before the held listener, the socket was writable at once with
// SO_ERROR 0.
func TestNonBlockingWaitsForFarSide(t *testing.T) {
	shim, prog := needBuilds(t)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, silent, func(c net.Conn) { io.Copy(io.Discard, c) }) // takes the hello, never answers
	cfg, err := vlink.NewConfig(nil, selector.Rule{Stack: "zstd", Via: silent.Addr().String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAgent(AgentConfig{Config: cfg, DialTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, host := range []string{"192.0.2.1", "2001:db8::1"} {
		t.Run(host, func(t *testing.T) {
			cmd := exec.Command(prog, "nbwait", host, "80", "500")
			cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+shim), a.Env()...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("conntest: %v\n%s", err, out)
			}
			for _, want := range []string{"within=pending\n", "getpeername_pending=ENOTCONN\n", "so_error=ETIMEDOUT\n"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
		})
	}
}

func TestThreads(t *testing.T) {
	lb := newLab(t)
	for _, r := range lb.routes() {
		t.Run(r.name, func(t *testing.T) {
			out := lb.mustRun(t, "threads", r.host, r.port, "64")
			if !strings.Contains(out, "ok 64 threads") {
				t.Errorf("got:\n%s", out)
			}
		})
	}
}

// The connects of a program through a mux stack are streams of one
// session, as a Go program's vlink.Dial makes them: one TCP connection
// to the gateway, not one per connect.
func TestMuxSessionShared(t *testing.T) {
	lb := newLab(t)
	out := lb.mustRun(t, "threads", "127.0.0.5", lb.port4, "20")
	if !strings.Contains(out, "ok 20 threads") {
		t.Fatalf("got:\n%s", out)
	}
	lb.mustRun(t, "errno", "127.0.0.5", lb.port4) // another process, the same agent
	if n := lb.gwConns.Load(); n != 1 {
		t.Errorf("21 connects through mux made %d TCP connections to the gateway, want 1", n)
	}
}

func TestFork(t *testing.T) {
	lb := newLab(t)
	for _, r := range lb.routes() {
		t.Run(r.name, func(t *testing.T) {
			out := lb.mustRun(t, "fork", r.host, r.port, lb.prog)
			for _, want := range []string{"ok parent before fork", "ok child without exec", "ok child with exec",
				"ok daemonized grandchild", "ok parent after fork"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
		})
	}
}

func TestCloseAll(t *testing.T) {
	lb := newLab(t)
	for _, r := range []string{"127.0.0.2", "127.0.0.3", "echo.far.test"} {
		t.Run(r, func(t *testing.T) {
			out := lb.mustRun(t, "closeall", r, lb.port4)
			for _, want := range []string{"ok connect after closing everything", "ok no descriptor visible"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in:\n%s", want, out)
				}
			}
		})
	}
}

func TestSocketOptions(t *testing.T) {
	lb := newLab(t)
	for _, r := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "echo.fdfar.test", "127.0.0.6"} {
		t.Run(r, func(t *testing.T) {
			out := lb.mustRun(t, "sockopt", r, lb.port4)
			if !strings.Contains(out, "ok options kept") || !strings.Contains(out, "ok echo") {
				t.Errorf("got:\n%s", out)
			}
		})
	}
}

func TestNames(t *testing.T) {
	lb := newLab(t)
	out := lb.mustRun(t, "names", "echo.far.test")
	for _, re := range []string{
		`getaddrinfo=198\.1[89]\.\d+\.\d+\n`,
		`getnameinfo=echo\.far\.test\n`,
		`getaddrinfo6=fd76:6c69:6e6b::[0-9a-f:]+\n`,
		`canonname=echo\.far\.test port=80\n`,
		`gethostbyname=echo\.far\.test 198\.1[89]\.`,
		`gethostbyname2=fd76:6c69:6e6b::`,
		`gethostbyname_r=198\.1[89]\.`,
		`gethostbyname_r\(small\)=ERANGE`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no %q in:\n%s", re, out)
		}
	}
	// The same name gets the same address in every process.
	again := lb.mustRun(t, "names", "echo.far.test")
	first := regexp.MustCompile(`getaddrinfo=\S+`)
	if first.FindString(out) != first.FindString(again) {
		t.Errorf("the name's address changed between processes: %s, then %s", first.FindString(out), first.FindString(again))
	}
	// A name the rules send direct is the system resolver's.
	out = lb.mustRun(t, "names", "localhost")
	if !strings.Contains(out, "getaddrinfo=127.0.0.1") && !strings.Contains(out, "getaddrinfo=::1") {
		t.Errorf("localhost: got:\n%s", out)
	}
}

// Names the far side resolves are asked about: one it does not know
// fails to resolve, as it would without the shim, and one with IPv4
// addresses only gets no IPv6 stand-in.
func TestNamesFarSide(t *testing.T) {
	lb := newLab(t)
	out, err := lb.run(t, nil, "errno", "nosuch.far.test", lb.port4)
	if err == nil || !strings.Contains(out, "getaddrinfo(nosuch.far.test, "+lb.port4+"): Name or service not known") {
		t.Errorf("a name the far side does not know: %v\n%s", err, out)
	}
	out = lb.mustRun(t, "names", "v4only.far.test")
	if !regexp.MustCompile(`getaddrinfo=198\.1[89]\.`).MatchString(out) {
		t.Errorf("v4only.far.test: no IPv4 stand-in in:\n%s", out)
	}
	if strings.Contains(out, "getaddrinfo6=") || strings.Contains(out, "gethostbyname2=") {
		t.Errorf("v4only.far.test: an IPv6 stand-in for a name with IPv4 addresses only:\n%s", out)
	}
	lb.mustRun(t, "errno", "v4only.far.test", lb.port4) // and it connects
	// The answers are cached: asking again costs the gateway nothing.
	before := lb.gwLookups.Load()
	if before == 0 {
		t.Fatal("the gateway was never asked")
	}
	for _, name := range []string{"nosuch.far.test", "v4only.far.test"} {
		lb.run(t, nil, "errno", name, lb.port4)
	}
	if n := lb.gwLookups.Load(); n != before {
		t.Errorf("names asked about again cost %d more lookups, want 0", n-before)
	}

	// With stand-ins, the old way: any routed name gets both families at
	// once, and a name nobody knows fails at connect.
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "*.far.test", Stack: "zstd", Via: lb.gw}}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAgent(AgentConfig{Config: cfg, StandIns: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cmd := exec.Command(lb.prog, "errno", "nosuch.far.test", lb.port4)
	cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+lb.shim), a.Env()...)
	b, _ := cmd.CombinedOutput()
	// The gateway could not resolve it: unreachable, as a name no one
	// resolves is (vlink.TargetRefusal).
	if !strings.Contains(string(b), "errno=EHOSTUNREACH") {
		t.Errorf("stand-ins: a name nobody knows should fail at connect, got:\n%s", b)
	}
}

func TestUDP(t *testing.T) {
	lb := newLab(t)
	out := lb.mustRun(t, "udp", "echo.far.test", "53")
	if !strings.Contains(out, "sendto=sent") || !strings.Contains(out, "connect=connected") {
		t.Errorf("a datagram to a far-side name: got:\n%s", out)
	}
	// Another datagram protocol is not carried: the shim says why, once,
	// where the program would only print ENETUNREACH.
	if !strings.Contains(out, "udplite=unsupported") {
		if !strings.Contains(out, "udplite=ENETUNREACH") {
			t.Errorf("a UDP-Lite socket to a far-side name: got:\n%s", out)
		}
		if n := strings.Count(out, "a datagram to a name the far side resolves is carried only on a UDP socket, not this one's protocol"); n != 1 {
			t.Errorf("the reason said %d times, want once:\n%s", n, out)
		}
	}
	out = lb.mustRun(t, "udp", "127.0.0.1", "9")
	if !strings.Contains(out, "sendto=sent") || !strings.Contains(out, "connect=connected") {
		t.Errorf("a datagram to a real address passes: got:\n%s", out)
	}
}

func TestFamilyMismatch(t *testing.T) {
	lb := newLab(t)
	kernel, err := exec.Command(lb.prog, "afmismatch", "127.0.0.1", lb.port4).Output()
	if err != nil || !strings.HasPrefix(string(kernel), "connect=E") {
		t.Fatalf("without the shim: %s %v", kernel, err)
	}
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		if out := lb.mustRun(t, "afmismatch", ip, lb.port4); out != string(kernel) {
			t.Errorf("%s: got %s, the kernel says %s", ip, out, kernel)
		}
	}
}

func TestPeerAfterExec(t *testing.T) {
	lb := newLab(t)
	out := lb.mustRun(t, "execpeer", "echo.far.test", lb.port4, lb.prog)
	m := regexp.MustCompile(`before=(\S+)\n`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "after="+m[1]+"\n") || !strings.HasPrefix(m[1], "198.1") {
		t.Errorf("getpeername after exec differs:\n%s", out)
	}
}

// Without an agent, the shim refuses rather than connecting direct.
func TestFailClosed(t *testing.T) {
	lb := newLab(t)
	for _, tc := range []struct {
		name string
		env  string
	}{
		{"agent-gone", "VLINK_AGENT=@vlink-agent-nobody-listens"},
		{"agent-unset", "VLINK_AGENT="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := lb.run(t, []string{tc.env}, "errno", "127.0.0.1", lb.port4)
			if !strings.Contains(out, "errno=ENETUNREACH") || !strings.Contains(out, "fail closed") {
				t.Errorf("want ENETUNREACH and a note, got:\n%s", out)
			}
			// A UDP socket's connect too: its datagrams never go direct.
			out, _ = lb.run(t, []string{tc.env}, "udpecho", "4", "127.0.0.2", lb.port4)
			if !strings.Contains(out, "connect: ENETUNREACH") {
				t.Errorf("udp: want ENETUNREACH, got:\n%s", out)
			}
			out, _ = lb.run(t, []string{tc.env}, "names", "echo.far.test")
			if !strings.Contains(out, "Temporary failure in name resolution") {
				t.Errorf("names: want a temporary failure, got:\n%s", out)
			}
		})
	}
}

// A shim channel from another user is refused.
// TestProgramTree: the agent serves the program's processes whatever user
// they become (a daemon's workers), and no other user's.
func TestProgramTree(t *testing.T) {
	testenv.Root(t, "to run processes as another user")
	lb := newLab(t)
	// Copies the user nobody can read and run.
	dir, err := os.MkdirTemp("", "vlink-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	prog, shim := filepath.Join(dir, "conntest"), filepath.Join(dir, "shim.so")
	for _, f := range [][2]string{{lb.prog, prog}, {lb.shim, shim}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := append(append(os.Environ(), "LD_PRELOAD="+shim), lb.agent.Env()...)

	t.Run("daemon worker", func(t *testing.T) {
		// Started as root, its worker clears its environment and becomes
		// nobody, then connects through the stack.
		cmd := exec.Command(prog, "daemon", "65534", "127.0.0.2", lb.port4)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "ok worker as uid 65534") {
			t.Errorf("a worker that became nobody: %v\n%s", err, out)
		}
	})
	t.Run("no token", func(t *testing.T) {
		// A child, as another user, that does not hold the token.
		cmd := exec.Command(prog, "errno", "127.0.0.2", lb.port4)
		cmd.Env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, EnvAgentToken+"=") })
		cmd.SysProcAttr = nobody()
		out, err := cmd.CombinedOutput()
		if !strings.Contains(string(out), "errno=ENETUNREACH") {
			t.Errorf("another user's process without the token: want ENETUNREACH, got %v:\n%s", err, out)
		}
	})
	t.Run("outside the tree", func(t *testing.T) {
		// Another user's process that holds the token but is not the
		// program's: the shell exits, and its background job is
		// re-parented away from this process.
		outFile := filepath.Join(dir, "out")
		script := fmt.Sprintf("(sleep 0.2; exec %s errno 127.0.0.2 %s) >%s 2>&1 &", prog, lb.port4, outFile)
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.Env = env
		cmd.SysProcAttr = nobody()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("sh: %v\n%s", err, out)
		}
		var out []byte
		for deadline := time.Now().Add(10 * time.Second); !bytes.Contains(out, []byte("errno=")); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the background job printed %q in 10s", out)
			}
			out, _ = os.ReadFile(outFile)
		}
		if !bytes.Contains(out, []byte("errno=ENETUNREACH")) {
			t.Errorf("another user's process outside the program, with the token: want ENETUNREACH, got:\n%s", out)
		}
		if !strings.Contains(lb.logs.String(), "refused a shim channel from a process outside the program") {
			t.Errorf("no refusal in the agent's log:\n%s", lb.logs.String())
		}
	})
}

func TestAgentClose(t *testing.T) {
	a, err := NewAgent(AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", a.Name())
	if err == nil {
		c.Close()
		t.Fatal("the agent's socket still accepts after Close")
	}
	if !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "refused") {
		t.Logf("dial after close: %v", err)
	}
}

// A hostile or broken shim gets its channel closed; the agent goes on
// serving the others.
func TestAgentBadInput(t *testing.T) {
	a, err := NewAgent(AgentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	dial := func() net.Conn {
		c, err := net.Dial("unix", a.Name())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	closed := func(c net.Conn) bool {
		// Unread bytes make the close a reset.
		_, err := c.Read(make([]byte, 64))
		return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"not a frame", []byte("GET / HTTP/1.1\r\n\r\n")},
		{"oversized", []byte{1, 6, 0xff, 0xff}},
		{"bad mode", appendFrame(nil, msgConnect, append(appendAddr(nil, netip.MustParseAddrPort("10.0.0.1:80")), 4, 7, 0, 0, 0, 0))},
		{"reply type", appendFrame(nil, msgWelcome, make([]byte, welcomeSize))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial()
			defer c.Close()
			c.Write(tc.in)
			if !closed(c) {
				t.Error("the agent kept the channel open")
			}
		})
	}
	// A good channel still works, and an invalid name is no such name.
	c := dial()
	defer c.Close()
	c.Write(appendRequest(nil, &request{typ: msgHello, pid: 1}))
	var buf [headerSize + maxBody]byte
	typ, body, err := readFrame(c, &buf)
	if err != nil || typ != msgWelcome || len(body) != welcomeSize {
		t.Fatalf("welcome: %v %v %d", typ, err, len(body))
	}
	if body[3]&welcomeIPTable != 0 {
		if typ, _, err := readFrame(c, &buf); err != nil || typ != msgIPTable {
			t.Fatalf("IP table: %v %v", typ, err)
		}
	}
	c.Write(appendRequest(nil, &request{typ: msgResolve, resolve: resolveReq{name: "bad name!"}}))
	if typ, body, err := readFrame(c, &buf); err != nil || typ != msgName || body[0] != nameNone {
		t.Fatalf("resolve of an invalid name: %v %v %x", typ, err, body)
	}
	// A token attached from another channel is ignored: nothing to assert
	// but that the agent survives it.
	c.Write(appendRequest(nil, &request{typ: msgAttach, attach: attachReq{token: 1, local: netip.MustParseAddrPort("127.0.0.1:1")}}))
	c.Write(appendRequest(nil, &request{typ: msgPeer, addr: netip.MustParseAddrPort("127.0.0.1:1")}))
	if typ, body, err := readFrame(c, &buf); err != nil || typ != msgPeerAddr || body[0] != 0 {
		t.Fatalf("peer of an unknown connection: %v %v %x", typ, err, body)
	}
}

// An unmodified epoll server takes plain and VLink clients on its own port:
// a plain client's own socket reaches its accept4 (the kernel's getpeername
// is the client's), a VLink client's connection is relayed with the client's
// address in getpeername, and a local process connecting to the private
// port behind the agent's back gets nowhere.
func TestServe(t *testing.T) {
	shim, prog := needBuilds(t)
	for _, fam := range []string{"4", "6"} {
		t.Run("ipv"+fam, func(t *testing.T) {
			port := realserver.FreePort(t)
			logs := &testnet.Buffer{}
			a, err := NewAgent(AgentConfig{
				Serve: &ServeConfig{
					Ports:  []uint16{uint16(port)},
					Listen: vlink.ListenConfig{Policy: vlink.Policy{Plain: vlink.PlainAllow}},
				},
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				a.Close()
				if t.Failed() {
					t.Logf("agent log:\n%s", logs.String())
				}
			}()
			cmd := exec.Command(prog, "server", fam, strconv.Itoa(port), "3")
			cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+shim, "VLINK_PRELOAD_DEBUG=1"), a.Env()...)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := bufio.NewScanner(out)
			next := func() string {
				t.Helper()
				if !lines.Scan() {
					t.Fatalf("the server said no more (%v)", lines.Err())
				}
				return lines.Text()
			}
			fields := func(line string) map[string]string {
				m := map[string]string{}
				for _, f := range strings.Fields(line) {
					if k, v, ok := strings.Cut(f, "="); ok {
						m[k] = v
					}
				}
				return m
			}
			addr := func(s string) netip.AddrPort {
				ap, err := netip.ParseAddrPort(s)
				if err != nil {
					t.Fatalf("address %q: %v", s, err)
				}
				return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			}
			ready := fields(next())
			if addr(ready["bound"]).Port() != uint16(port) || addr(ready["private"]).Port() == uint16(port) {
				t.Fatalf("listening: getsockname %s (want port %d), the kernel's %s (want another)", ready["bound"], port, ready["private"])
			}
			target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			check := func(c net.Conn, want netip.AddrPort, kernelToo bool) {
				t.Helper()
				testnet.RoundTrip(t, c, 1<<20+3)
				got := fields(next())
				if addr(got["peer"]) != want {
					t.Errorf("getpeername %s, want the client's %s", got["peer"], want)
				}
				if (addr(got["kernel_peer"]) == want) != kernelToo {
					t.Errorf("the kernel's getpeername %s, client %s: want the client's own socket %v", got["kernel_peer"], want, kernelToo)
				}
				if addr(got["local"]).Port() != uint16(port) || got["nonblock"] != "1" || got["cloexec"] != "1" {
					t.Errorf("getsockname %s (want port %d), nonblock %s, cloexec %s: want accept4's flags", got["local"], port, got["nonblock"], got["cloexec"])
				}
			}

			plain, err := net.Dial("tcp", target)
			if err != nil {
				t.Fatal(err)
			}
			check(plain, addr(plain.LocalAddr().String()), true)
			plain.Close()

			d := vlink.Dialer{Stack: vlink.MustParse("zstd")}
			vc, err := d.Dial("tcp", target)
			if err != nil {
				t.Fatal(err)
			}
			check(vc, addr(vc.LocalAddr().String()), false)
			vc.Close()

			// Behind the agent's back: the server's accept drops it.
			sneak, err := net.Dial("tcp", addr(ready["private"]).String())
			if err != nil {
				t.Fatal(err)
			}
			sneak.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := sneak.Read(make([]byte, 1)); n != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("a connection to the private port: read %d, %v; want it closed", n, err)
			}
			sneak.Close()

			last, err := net.Dial("tcp", target)
			if err != nil {
				t.Fatal(err)
			}
			check(last, addr(last.LocalAddr().String()), true)
			last.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
}

// TestRecipe: after the agent's first blocking connect through a tcp
// route to a gateway with no key, the shim makes the next ones to that
// destination by itself (preload/recipe.go): each goes through the
// gateway, with the route's options and the program's own over them,
// getpeername's address and the echo, and the agent hears of none. A
// target that refuses then gets the program ECONNREFUSED, as the agent's
// way does, and the recipe still serves once the target is back.
// VLINK_PRELOAD_CACHE=0 asks the agent every time.
func TestRecipe(t *testing.T) {
	lb := newLab(t)
	target := echoListener(t, "127.0.0.1:0")
	port := strconv.Itoa(target.Addr().(*net.TCPAddr).Port)
	passed := regexp.MustCompile(`msg="passed a descriptor" [^\n]*to=127.0.0.3:` + port + `[^\n]*recipe=true`)

	steps := func(env ...string) (step func(line string) string, done func()) {
		return startSteps(t, lb.prog, append(append([]string{"LD_PRELOAD=" + lb.shim}, lb.agent.Env()...), env...), "127.0.0.3", port)
	}
	const connected = "errno=connected peer=ok keepidle=15 echo=ok"
	step, done := steps()
	before := lb.gwConns.Load()
	for i, tc := range []struct{ line, want string }{
		{"", connected}, // the agent's, with the recipe
		{"", connected}, // the shim's
		{"opt", "errno=connected peer=ok keepidle=77 echo=ok"}, // the program's option over the route's
		{"", connected},
	} {
		if got := step(tc.line); got != tc.want {
			t.Errorf("connect %d: %q, want %q", i+1, got, tc.want)
		}
	}
	if n := lb.gwConns.Load() - before; n != 4 {
		t.Errorf("the gateway took %d connections, want 4", n)
	}
	if n := len(passed.FindAllString(lb.logs.String(), -1)); n != 1 {
		t.Errorf("the agent passed %d descriptors with a recipe, want 1 (the first connect)", n)
	}

	target.Close()
	if got := step(""); got != "errno=ECONNREFUSED" {
		t.Errorf("connect to a target that refuses: %q, want errno=ECONNREFUSED", got)
	}
	if !regexp.MustCompile(`msg="cannot connect" [^\n]*to=127.0.0.3:` + port + ` recipe=true`).MatchString(lb.logs.String()) {
		t.Errorf("the agent did not read the gateway's refusal for the shim")
	}
	echoListener(t, "127.0.0.1:"+port)
	if got := step(""); got != connected {
		t.Errorf("connect once the target is back: %q, want %q", got, connected)
	}
	done()
	if n := len(passed.FindAllString(lb.logs.String(), -1)); n != 1 {
		t.Errorf("the agent passed %d descriptors with a recipe, want 1: the shim kept its recipe past the refusal", n)
	}

	step, done = steps("VLINK_PRELOAD_CACHE=0")
	askEachTime(t, step, done, connected, func() int { return len(passed.FindAllString(lb.logs.String(), -1)) })
}

// TestRecipeDirect: a `tcp` route with options and no gateway is the
// program's own connect, blocking or not, with the route's options set
// (TCP_KEEPIDLE 7) where the program set none: the agent answers a first
// non-blocking one with a direct recipe, a first blocking one with its
// descriptor and the recipe, and the shim makes the next ones alone. A
// refusal is the kernel's, as without vlink, and the recipe holds.
func TestRecipeDirect(t *testing.T) {
	lb := newLab(t)
	target := echoListener(t, "127.0.0.6:0") // the lab's rule for 127.0.0.6: tcp:keepalive=7s, no gateway
	port := strconv.Itoa(target.Addr().(*net.TCPAddr).Port)
	asked := regexp.MustCompile(`msg="direct, with the route's options" [^\n]*to=127.0.0.6:` + port)
	env := append([]string{"LD_PRELOAD=" + lb.shim}, lb.agent.Env()...)
	const connected = "errno=connected peer=ok keepidle=7 echo=ok"

	step, done := startSteps(t, lb.prog, env, "127.0.0.6", port)
	for i, tc := range []struct{ line, want string }{
		{"nb", connected}, // asks: the agent's direct recipe
		{"", connected},   // the shim alone, from here on
		{"nb", connected},
		{"opt", "errno=connected peer=ok keepidle=77 echo=ok"},
	} {
		if got := step(tc.line); got != tc.want {
			t.Errorf("connect %d (%q): %q, want %q", i+1, tc.line, got, tc.want)
		}
	}
	target.Close()
	for _, line := range []string{"", "nb"} {
		if got := step(line); got != "errno=ECONNREFUSED" {
			t.Errorf("%q connect to a closed port: %q, want errno=ECONNREFUSED", line, got)
		}
	}
	echoListener(t, "127.0.0.6:"+port)
	if got := step(""); got != connected {
		t.Errorf("connect once the port is open again: %q, want %q", got, connected)
	}
	done()
	if n := strings.Count(lb.logs.String(), "127.0.0.6:"+port); n != 1 || !asked.MatchString(lb.logs.String()) {
		t.Errorf("the agent saw %d connects to 127.0.0.6:%s, want 1, answered with a direct recipe: the rest are the program's own", n, port)
	}

	if regexp.MustCompile(`msg="passed a descriptor"[^\n]*to=127.0.0.6:` + port).MatchString(lb.logs.String()) {
		t.Errorf("the agent connected for a socket that could connect itself")
	}

	step, done = startSteps(t, lb.prog, append(env, "VLINK_PRELOAD_CACHE=0"), "127.0.0.6", port)
	for i := range 2 {
		if got := step("nb"); got != connected {
			t.Errorf("without the cache, connect %d: %q, want %q", i+1, got, connected)
		}
	}
	done()
	if n := len(asked.FindAllString(lb.logs.String(), -1)); n != 3 {
		t.Errorf("without the cache: the agent answered %d connects with a direct recipe in all, want 3 (every connect asks)", n)
	}

	// A first connect that blocks is the agent's, which passes the
	// descriptor and the recipe with it; the next ones are the program's.
	other := echoListener(t, "127.0.0.6:0")
	oport := strconv.Itoa(other.Addr().(*net.TCPAddr).Port)
	step, done = startSteps(t, lb.prog, env, "127.0.0.6", oport)
	for i, line := range []string{"", "nb", ""} {
		if got := step(line); got != connected {
			t.Errorf("port %s, connect %d (%q): %q, want %q", oport, i+1, line, got, connected)
		}
	}
	done()
	if n := strings.Count(lb.logs.String(), "127.0.0.6:"+oport); n != 1 ||
		!regexp.MustCompile(`msg="passed a descriptor"[^\n]*to=127.0.0.6:`+oport+`[^\n]*recipe=true`).MatchString(lb.logs.String()) {
		t.Errorf("the agent saw %d connects to 127.0.0.6:%s, want 1, a descriptor with a recipe", n, oport)
	}
}

// echoListener starts an echo server on addr (IPv4), which a test may
// close and start again on the same port.
func echoListener(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		testnet.Echo(c)
	})
	return l
}

// askEachTime makes two connects with step, in a program run with the
// caches off, and checks that each asked the agent: recipes counts the
// descriptors passed with a recipe, one before these.
func askEachTime(t *testing.T, step func(string) string, done func(), connected string, recipes func() int) {
	t.Helper()
	for i := range 2 {
		if got := step(""); got != connected {
			t.Errorf("without the cache, connect %d: %q, want %q", i+1, got, connected)
		}
	}
	done()
	if n := recipes(); n != 3 {
		t.Errorf("without the cache: %d descriptors passed with a recipe in all, want 3 (every connect asks)", n)
	}
}

// startSteps starts conntest's steps mode, connecting to host:port once
// per line, in an environment with env added. step sends a line and
// returns the line conntest answers; done ends it and checks its exit.
func startSteps(t *testing.T, prog string, env []string, host, port string) (step func(line string) string, done func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, prog, "steps", host, port)
	cmd.Env = append(os.Environ(), env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	step = func(line string) string {
		t.Helper()
		if _, err := io.WriteString(in, line+"\n"); err != nil {
			t.Fatal(err)
		}
		s, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("conntest steps: %v", err)
		}
		return strings.TrimSpace(s)
	}
	return step, func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("conntest steps: %v", err)
		}
		cancel()
	}
}

// TestRecipeGatewayDown: when a recipe's gateway is gone, the shim drops
// the recipe and asks the agent, whose own connect fails as it would
// without one (the gateway's port refuses); once the gateway is back, the
// agent connects and hands out a new recipe, which the next connect takes.
func TestRecipeGatewayDown(t *testing.T) {
	shim, prog := needBuilds(t)
	echo := echoServer(t, "tcp4", "127.0.0.1:0")
	lc := vlink.ListenConfig{Policy: vlink.Policy{Targets: []selector.Rule{{Action: selector.Direct}}, Plain: vlink.PlainRefuse},
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", echo)
		},
	}
	var gwConns atomic.Int64
	gateway := func(addr string) net.Listener {
		t.Helper()
		l, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		testnet.Serve(t, l, func(c net.Conn) {
			gwConns.Add(1)
			netconn.Relay(c, c.(*vlink.Conn).Admitted().(net.Conn))
		})
		return l
	}
	gw := gateway("127.0.0.1:0")
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.7", Stack: "tcp", Via: gw.Addr().String()}}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testnet.Buffer{}
	a, err := NewAgent(AgentConfig{Config: cfg, DialTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()
	_, port, _ := net.SplitHostPort(echo)
	passed := func() int { return strings.Count(logs.String(), `msg="passed a descriptor"`) }
	const connected = "errno=connected peer=ok keepidle=15 echo=ok"
	step, done := startSteps(t, prog, append([]string{"LD_PRELOAD=" + shim}, a.Env()...), "127.0.0.7", port)
	defer done()
	for i := range 2 { // the agent's, with a recipe; the shim's
		if got := step(""); got != connected {
			t.Fatalf("connect %d: %q, want %q", i+1, got, connected)
		}
	}
	if n := passed(); n != 1 || gwConns.Load() != 2 {
		t.Fatalf("%d descriptors passed, %d gateway connections; want 1 and 2", n, gwConns.Load())
	}

	gw.Close()
	if got := step(""); got != "errno=ECONNREFUSED" {
		t.Errorf("connect with the gateway down: %q, want errno=ECONNREFUSED (its port's)", got)
	}
	if !strings.Contains(logs.String(), `msg="cannot connect"`) {
		t.Errorf("the agent was not asked once the recipe's gateway refused")
	}

	gateway(gw.Addr().String())
	for i := range 2 { // the agent's, with a new recipe; the shim's again
		if got := step(""); got != connected {
			t.Errorf("connect %d with the gateway back: %q, want %q", i+1, got, connected)
		}
	}
	if n := passed(); n != 2 {
		t.Errorf("%d descriptors passed in all, want 2: the dropped recipe's connect, then a new recipe's", n)
	}
	if n := gwConns.Load(); n != 4 {
		t.Errorf("the gateway took %d connections in all, want 4", n)
	}
}

// TestRecipeTimeout: a recipe's gateway that takes the hello and then
// never answers gets the program ETIMEDOUT at the connect's time, as the
// agent's own connect does, or EINTR when a signal cuts the wait, and
// either way a fresh socket it can connect again.
func TestRecipeTimeout(t *testing.T) {
	shim, prog := needBuilds(t)
	echo := echoServer(t, "tcp4", "127.0.0.1:0")
	var admitted atomic.Int64
	lc := vlink.ListenConfig{Policy: vlink.Policy{Targets: []selector.Rule{{Action: selector.Direct}}, Plain: vlink.PlainRefuse},
		MaxTargetWait: time.Minute,
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			if n := admitted.Add(1); n == 2 || n == 4 { // no answer until the dialer leaves
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return (&net.Dialer{}).DialContext(ctx, "tcp", echo)
		},
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) { netconn.Relay(c, c.(*vlink.Conn).Admitted().(net.Conn)) })
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.7", Stack: "tcp", Via: l.Addr().String()}}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testnet.Buffer{}
	a, err := NewAgent(AgentConfig{Config: cfg, DialTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, port, _ := net.SplitHostPort(echo)
	cmd := exec.Command(prog, "steps", "127.0.0.7", port)
	cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+shim), a.Env()...)
	cmd.Stdin = strings.NewReader("\nintr\n\n\n")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	const ok = "errno=connected peer=ok keepidle=15 echo=ok\n"
	want := ok + "errno=EINTR then " + ok + "errno=ETIMEDOUT\n" + ok
	if err != nil || string(out) != want {
		t.Errorf("conntest steps: %v\n%s\nwant:\n%s", err, out, want)
	}
	if took < time.Second || took > 6*time.Second {
		t.Errorf("the connects, one cut after 0.3 s and one timed out, took %v; want the agent's second and a little more", took)
	}
	if n := admitted.Load(); n != 5 {
		t.Errorf("the gateway admitted %d hellos, want 5", n)
	}
	// The agent made the first alone: the connect again after EINTR
	// found a fresh socket, as unconnected as before, and took the recipe.
	if n := strings.Count(logs.String(), `msg="passed a descriptor"`); n != 1 {
		t.Errorf("the agent passed %d descriptors, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `msg="cannot connect" pid=`) || !strings.Contains(logs.String(), "recipe=true") {
		t.Errorf("the agent did not log the shim's timed-out connect:\n%s", logs.String())
	}
}

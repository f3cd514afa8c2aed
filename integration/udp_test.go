//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// startDnsmasq runs dnsmasq on loopback, answering every name under
// example.test with 192.0.2.7 and refusing the rest.
func startDnsmasq(t *testing.T) string {
	t.Helper()
	port := realserver.FreePort(t)
	p := startProc(t, "dnsmasq", "--keep-in-foreground", "--log-facility=-", "--conf-file=/dev/null", "--pid-file",
		"--port", strconv.Itoa(port), "--listen-address", "127.0.0.1", "--bind-interfaces",
		"--no-resolv", "--no-hosts", "--address=/example.test/192.0.2.7")
	p.WaitFor(t, regexp.MustCompile(`started, version`), startTimeout)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// udpEchoServer is a UDP echo server in one process: every datagram back
// to its sender, whole. (socat's UDP4-RECVFROM with fork, a process per
// datagram, now and then under load answered a peer's first datagram and
// never its next one.)
const udpEchoServer = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("echoing", flush=True)
while True:
    b, peer = s.recvfrom(65536)
    s.sendto(b, peer)
`

// startUDPEcho runs udpEchoServer on a free loopback port.
func startUDPEcho(t *testing.T) string {
	t.Helper()
	port := realserver.FreePort(t)
	p := startProc(t, "python3", "-c", udpEchoServer, strconv.Itoa(port))
	p.WaitFor(t, regexp.MustCompile(`^echoing`), startTimeout)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// udpClient is a Python program that sends datagrams of the sizes given
// on a connected UDP socket and prints, for each, the size of the
// answer and whether its SHA-256 matches what was sent.
const udpClient = `
import hashlib, os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((host, port))
s.settimeout(5)
for n in map(int, sys.argv[3:]):
    msg = os.urandom(n)
    s.send(msg)
    got = s.recv(65536)
    print(n, len(got), hashlib.sha256(got).digest() == hashlib.sha256(msg).digest())
`

// echoedWhole runs udpClient, under the commands of wrap if any (env,
// socksify), against the UDP echo at addr with datagrams of the sizes
// given, and checks that each came back whole.
func echoedWhole(t *testing.T, wrap []string, addr string, sizes ...string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	args := append(append(append([]string(nil), wrap...), "python3", "-c", udpClient, host, port), sizes...)
	out, stderr, err := run(time.Minute, nil, args[0], args[1:]...)
	if err != nil {
		t.Fatalf("%v: %v\n%s%s", wrap, err, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(sizes) {
		t.Fatalf("python3 printed %q, want one line per datagram", out)
	}
	for i, l := range lines {
		if want := sizes[i] + " " + sizes[i] + " True"; l != want {
			t.Errorf("datagram %d: %q, want %q (the datagram back whole, same SHA-256)", i, l, want)
		}
	}
}

// TestUDPTunnel carries datagrams from unmodified UDP programs (dig,
// Python's socket module) through vlink tunnel --udp and a gateway,
// vlink serve --allow-udp, to a real DNS server (dnsmasq) and a UDP echo,
// over several stacks.
func TestUDPTunnel(t *testing.T) {
	testenv.Programs(t, "dnsmasq", "dig", "python3")
	dns, echo := startDnsmasq(t), startUDPEcho(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "vlink.key")
	writeFile(t, key, "udp-test-key-0123456789abcdef\n")
	_, gw := startVLink(t, "serve", "--key-file", key, "--allow-udp", dns, "--allow-udp", echo, "--log-level", "debug")
	for _, stack := range []string{"zstd", "mux+lz4", "tcp"} {
		t.Run(stack, func(t *testing.T) {
			_, tdns := startVLink(t, "tunnel", "--udp", "--via", gw, "--to", dns, "--stack", stack, "--key-file", key)
			_, techo := startVLink(t, "tunnel", "--udp", "--via", gw, "--to", echo, "--stack", stack, "--key-file", key)

			host, port, _ := net.SplitHostPort(tdns)
			out, stderr, err := run(time.Minute, nil, "dig", "+short", "+time=5", "+tries=1", "@"+host, "-p", port, "www.example.test")
			if err != nil || strings.TrimSpace(string(out)) != "192.0.2.7" {
				t.Fatalf("dig through the tunnel: %q, %v, %s; want 192.0.2.7", out, err, stderr)
			}
			out, _, _ = run(time.Minute, nil, "dig", "+time=5", "+tries=1", "@"+host, "-p", port, "elsewhere.test")
			if !strings.Contains(string(out), "status: REFUSED") {
				t.Fatalf("dig of a name dnsmasq does not serve: want its REFUSED answer, got:\n%s", out)
			}

			echoedWhole(t, nil, techo, "1", "512", "1472", "9000", "60000", "65507")
		})
	}
}

// TestUDPTunnelQUIC: over a quic stack, vlink tunnel --udp and vlink
// serve --quic --allow-udp carry the datagrams that fit a packet in QUIC
// DATAGRAM frames (RFC 9221), as serve logs (quic_datagrams=true), and
// the larger ones on the stream: every one comes back whole.
func TestUDPTunnelQUIC(t *testing.T) {
	testenv.Programs(t, "python3")
	echo := startUDPEcho(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "vlink.key")
	writeFile(t, key, "udp-test-key-0123456789abcdef\n")
	serve, gw := startVLink(t, "serve", "--quic", "--key-file", key, "--allow-udp", echo, "--log-level", "debug")
	_, techo := startVLink(t, "tunnel", "--udp", "--via", gw, "--to", echo, "--stack", "quic", "--key-file", key)
	echoedWhole(t, nil, techo, "1", "512", "1100", "1472", "9000", "60000", "65507", "64")
	serve.WaitFor(t, regexp.MustCompile(`msg="relaying datagrams" .*udp=true quic_datagrams=true`), startTimeout)
}

// dnsQuery is a Python program that asks a DNS server for a name's A
// record with a plain sendto and recvfrom, as resolver libraries do, and
// prints the number of answers and the first address.
const dnsQuery = `
import socket, struct, sys
server, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, (server, port))
r, _ = s.recvfrom(4096)
n = struct.unpack(">H", r[6:8])[0]
print("answers", n, "ip", ".".join(str(b) for b in r[-4:]) if n else "-")
`

// TestSOCKSUDP: unmodified UDP programs under Dante's SOCKS client
// library (socksify), which sends their datagrams through SOCKS5 UDP
// ASSOCIATE to vlink socks, which carries them through a gateway
// (vlink serve --allow-udp) to dnsmasq and a UDP echo server.
func TestSOCKSUDP(t *testing.T) {
	testenv.Programs(t, "dnsmasq", "python3", "socksify")
	dns, echo := startDnsmasq(t), startUDPEcho(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "vlink.key")
	writeFile(t, key, "socks-udp-test-key-0123456789abcdef\n")
	_, gw := startVLink(t, "serve", "--key-file", key, "--allow-udp", dns, "--allow-udp", echo)
	socksProc, socksAddr := startVLink(t, "socks", "--stack", "zstd", "--via", gw, "--key-file", key, "--log-level", "debug")
	host, port, _ := net.SplitHostPort(socksAddr)
	conf := filepath.Join(dir, "dante.conf")
	writeFile(t, conf, fmt.Sprintf(`route {
  from: 0.0.0.0/0 to: 0.0.0.0/0 via: %s port = %s
  proxyprotocol: socks_v5
  protocol: tcp udp
  method: none
}
`, host, port))
	// Dante sends LAN destinations direct unless told not to.
	wrap := []string{"env", "SOCKS_CONF=" + conf, "SOCKS_AUTOADD_LANROUTES=no", "socksify"}
	socksify := func(args ...string) ([]byte, string, error) {
		return run(time.Minute, nil, wrap[0], append(wrap[1:len(wrap):len(wrap)], args...)...)
	}

	dhost, dport, _ := net.SplitHostPort(dns)
	out, stderr, err := socksify("python3", "-c", dnsQuery, dhost, dport, "www.example.test")
	if err != nil || strings.TrimSpace(string(out)) != "answers 1 ip 192.0.2.7" {
		t.Fatalf("DNS query through SOCKS5 UDP: %q, %v, %s", out, err, stderr)
	}
	echoedWhole(t, wrap, echo, "1", "512", "1472", "9000", "60000")
	if n := strings.Count(socksProc.Output(), `msg="UDP association"`); n < 2 {
		t.Errorf("vlink socks logged %d UDP associations, want one per program (2): the datagrams went around it?", n)
	}

	// A destination the gateway does not allow: no answer, and the log
	// says why.
	other := startUDPEcho(t)
	ohost, oport, _ := net.SplitHostPort(other)
	if out, _, err := socksify("python3", "-c", udpClient, ohost, oport, "10"); err == nil {
		t.Fatalf("an echo the gateway does not allow answered: %s", out)
	}
	socksProc.WaitFor(t, regexp.MustCompile(`msg="UDP association: cannot reach destination"[^\n]*relaying datagrams to \S+ is not allowed here`), startTimeout)
}

// TestUDPNotAllowed: a gateway that forwards streams to a target relays
// no datagrams to it unless --allow-udp says so, and the tunnel says why.
func TestUDPNotAllowed(t *testing.T) {
	testenv.Programs(t, "dnsmasq", "dig")
	dns := startDnsmasq(t)
	_, gw := startVLink(t, "serve", "--allow", dns)
	tun, tdns := startVLink(t, "tunnel", "--udp", "--via", gw, "--to", dns, "--stack", "zstd")
	host, port, _ := net.SplitHostPort(tdns)
	if out, _, err := run(time.Minute, nil, "dig", "+short", "+time=2", "+tries=1", "@"+host, "-p", port, "www.example.test"); err == nil {
		t.Fatalf("dig got an answer through a gateway that relays no datagrams: %s", out)
	}
	tun.WaitFor(t, regexp.MustCompile(`msg="cannot reach destination"[^\n]*this listener relays no datagrams \(Policy.Datagrams, vlink serve --allow-udp\)`), startTimeout)
}

// iperfUDP is the part of iperf3's UDP report the tests read.
type iperfUDP struct {
	Error string `json:"error"`
	End   struct {
		Streams []struct {
			UDP struct {
				Packets    int64   `json:"packets"`
				Lost       int64   `json:"lost_packets"`
				OutOfOrder int64   `json:"out_of_order"`
				LostPct    float64 `json:"lost_percent"`
			} `json:"udp"`
		} `json:"streams"`
		SumReceived iperfSum `json:"sum_received"`
	} `json:"end"`
}

// TestUDPIperf3 runs iperf3 -u through one tunnel process that carries
// the control connection (TCP) and the datagrams (UDP) on one port, from
// a --forwards file: every datagram over a stream stack arrives, in
// order, or is dropped before it (never reordered).
func TestUDPIperf3(t *testing.T) {
	testenv.Programs(t, "iperf3")
	port := realserver.FreePort(t)
	srv := fmt.Sprintf("127.0.0.1:%d", port)
	iperf := startProc(t, "iperf3", "-s", "-B", "127.0.0.1", "-p", strconv.Itoa(port), "--forceflush") // its lines as they come
	iperf.WaitListening(t, port)
	_, gw := startVLink(t, "serve", "--allow", srv, "--allow-udp", srv)
	local := realserver.FreePort(t)
	file := filepath.Join(t.TempDir(), "tunnels.toml")
	writeFile(t, file, fmt.Sprintf(`
[[forward]]
name = "iperf3 control"
listen = "127.0.0.1:%[1]d"
via = %[2]q
to = %[3]q
stack = "zstd"

[[forward]]
name = "iperf3 data"
udp = true
listen = "127.0.0.1:%[1]d"
via = %[2]q
to = %[3]q
stack = "zstd"
`, local, gw, srv))
	tun := startProc(t, vlinkBin, "tunnel", "--forwards", file, "--grace", "1s")
	tun.CleanExit = true
	tun.WaitFor(t, regexp.MustCompile(`msg="running forwards" file=\S+ count=2`), startTimeout)
	for i, tc := range []struct {
		name string
		args []string
	}{{"upload", nil}, {"download", []string{"-R"}}} {
		// iperf3 serves one test at a time, and is ready for the next
		// only once it says so: it ends a UDP test after its client.
		iperf.WaitFor(t, regexp.MustCompile(fmt.Sprintf(`Server listening on %d \(test #%d\)`, port, i+1)), startTimeout)
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-c", "127.0.0.1", "-p", strconv.Itoa(local), "--json", "-u", "-b", "50M", "-l", "1400", "-t", "2"}, tc.args...)
			out, stderr, err := run(time.Minute, nil, "iperf3", args...)
			var r iperfUDP
			if jerr := json.Unmarshal(out, &r); jerr != nil || err != nil || r.Error != "" || len(r.End.Streams) != 1 {
				t.Fatalf("iperf3 %v: %v, %v, %q: %s%s", args, err, jerr, r.Error, out, stderr)
			}
			u := r.End.Streams[0].UDP
			t.Logf("%d datagrams, %d lost (%.2f%%), %d out of order, %.0f Mbit/s received",
				u.Packets, u.Lost, u.LostPct, u.OutOfOrder, r.End.SumReceived.BitsPerSecond/1e6)
			if r.End.SumReceived.Bytes == 0 || u.Packets == 0 {
				t.Fatal("no datagram arrived")
			}
			if u.OutOfOrder != 0 {
				t.Errorf("%d datagrams out of order: a stream stack delivers them in order", u.OutOfOrder)
			}
			if u.LostPct > 20 {
				t.Errorf("%.1f%% of the datagrams lost at 50 Mbit/s on loopback", u.LostPct)
			}
		})
	}
}

// TestNodeUDP: a node serves a UDP service by name (vlink serve --node
// --allow-udp localhost:PORT), and another node reaches it through the
// relay and through a spliced path, as its TCP services are reached.
func TestNodeUDP(t *testing.T) {
	testenv.Programs(t, "dnsmasq", "dig")
	dir := t.TempDir()
	networkKey, dbKey, laptopKey := networkKeys(t, dir)
	_, relayAddr := startVLink(t, "relay", "--key-file", networkKey)
	dns := startDnsmasq(t)
	_, dnsPort, _ := net.SplitHostPort(dns)
	serve := startProc(t, vlinkBin, "serve", "--listen", "127.0.0.1:0", "--grace", "1s", "--log-level", "debug",
		"--node", "db", "--relay", relayAddr, "--node-key-file", dbKey, "--allow-udp", "localhost:"+dnsPort)
	serve.Name, serve.CleanExit = "vlink serve", true
	serve.WaitFor(t, regexp.MustCompile(`msg="serving as a node" node=db`), startTimeout)
	for _, tc := range []struct{ name, stack, path string }{
		{"relay", "zstd+relay", "relay"},
		{"splice", "zstd", "splice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tun, addr := startVLink(t, "tunnel", "--udp", "--to", "db.vlink.alt:"+dnsPort, "--stack", tc.stack,
				"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
			host, port, _ := net.SplitHostPort(addr)
			out, stderr, err := run(time.Minute, nil, "dig", "+short", "+time=5", "+tries=1", "@"+host, "-p", port, "www.example.test")
			if err != nil || strings.TrimSpace(string(out)) != "192.0.2.7" {
				t.Fatalf("dig through node db: %q, %v, %s\ntunnel:\n%s", out, err, stderr, realserver.Tail(tun.Output(), 2000))
			}
			serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+dnsPort+` path=`+tc.path), startTimeout)
			// Two holders of the name laptop would push each other off
			// the relay: one at a time.
			tun.Stop(t)
		})
	}
	// A port the node relays no datagrams to is refused at the relay.
	_, other := startVLink(t, "tunnel", "--udp", "--to", "db.vlink.alt:9", "--stack", "zstd",
		"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
	host, port, _ := net.SplitHostPort(other)
	if out, _, err := run(time.Minute, nil, "dig", "+short", "+time=2", "+tries=1", "@"+host, "-p", port, "www.example.test"); err == nil {
		t.Fatalf("a port db does not allow answered: %s", out)
	}
}

// pingServer is a Python UDP server that answers "ping..." datagrams
// and nothing else, so a flood of other datagrams is one-way.
const pingServer = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print("port", s.getsockname()[1], flush=True)
while True:
    b, a = s.recvfrom(65536)
    if b.startswith(b"ping"):
        s.sendto(b"pong" + b[4:], a)
`

// pingClient pings addr from one socket, every 100 ms for the seconds
// given, and prints how many answers came back.
const pingClient = `
import socket, sys, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((host, port))
s.settimeout(0.5)
got = sent = 0
end = time.time() + secs
while time.time() < end:
    s.send(b"ping%d" % sent)
    sent += 1
    try:
        while s.recv(100) != b"pong%d" % (sent - 1):
            pass
        got += 1
    except socket.timeout:
        pass
    time.sleep(0.1)
print("sent", sent, "answered", got)
`

// TestUDPBounds: the bounds hold under floods, and the clients that talk
// both ways keep being served. A tunnel whose session table is full of
// one-way sources gives their places to new clients, never a two-way
// session's; a gateway gives one client no more than its share.
func TestUDPBounds(t *testing.T) {
	testenv.Programs(t, "python3")
	srv := startProc(t, "python3", "-u", "-c", pingServer)
	target := "127.0.0.1:" + srv.WaitFor(t, regexp.MustCompile(`port (\d+)`), startTimeout)[1]
	_, gw := startVLink(t, "serve", "--allow-udp", target)
	_, addr := startVLink(t, "tunnel", "--udp", "--udp-sessions", "4", "--via", gw, "--to", target, "--stack", "zstd")
	host, port, _ := net.SplitHostPort(addr)

	// A client pings for 4 s while 300 one-way sources flood the tunnel.
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, _, err := run(time.Minute, nil, "python3", "-c", pingClient, host, port, "4")
		done <- result{out, err}
	}()
	time.Sleep(500 * time.Millisecond)
	for i := range 300 {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(fmt.Appendf(nil, "junk %d", i))
		c.Close()
		if i%50 == 49 {
			time.Sleep(200 * time.Millisecond)
		}
	}
	r := <-done
	var sent, answered int
	if _, err := fmt.Sscanf(string(r.out), "sent %d answered %d", &sent, &answered); err != nil || r.err != nil {
		t.Fatalf("ping client: %q, %v", r.out, r.err)
	}
	if sent < 20 || answered < sent-2 {
		t.Errorf("the two-way client got %d answers of %d pings through the flood, want all but one or two", answered, sent)
	}
	// A new client still gets in: a one-way session gives way.
	out, _, err := run(time.Minute, nil, "python3", "-c", pingClient, host, port, "1")
	if err != nil || !regexp.MustCompile(`answered [1-9]`).Match(out) {
		t.Errorf("a new client after the flood: %q, %v", out, err)
	}
	// The gateway's share per client: the sessions of a tunnel all come
	// from one address, so the seventh at once is refused.
	_, gw6 := startVLink(t, "serve", "--allow-udp", target, "--udp-sessions-per-client", "6")
	wide, waddr := startVLink(t, "tunnel", "--udp", "--via", gw6, "--to", target, "--stack", "zstd")
	whost, wport, _ := net.SplitHostPort(waddr)
	results := make(chan result, 7)
	for range 7 {
		go func() {
			out, _, err := run(time.Minute, nil, "python3", "-c", pingClient, whost, wport, "2")
			results <- result{out, err}
		}()
	}
	starved := 0
	for range 7 {
		r := <-results
		if r.err != nil {
			t.Fatalf("ping client: %q, %v", r.out, r.err)
		}
		if strings.Contains(string(r.out), "answered 0") {
			starved++
		}
	}
	if starved != 1 {
		t.Errorf("%d of 7 clients got no answer, want 1: the gateway lets one client hold 6 sessions at once", starved)
	}
	wide.WaitFor(t, regexp.MustCompile(`relaying 6 datagram sessions for 127\.0\.0\.1 already \(vlink serve --udp-sessions-per-client\)`), startTimeout)
}

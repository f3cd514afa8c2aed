package integration

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// Ports of the UDP servers in TestExecUDP's far site.
const (
	farDNS       = 5353
	farUDPEcho   = 7007
	farUDPClosed = 7999 // nothing listens
)

// execUDPClient is a Python program that sends datagrams of the sizes
// given with sendto to HOST PORT on UDP sockets of both families,
// connected to it first with "connect", and prints for each the family,
// the size sent and received, whether the SHA-256 matches, and whether
// recvfrom's source is the address sent to (and getpeername too, on a
// connected socket).
const execUDPClient = `
import hashlib, os, socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
for fam in (socket.AF_INET, socket.AF_INET6):
    addr = socket.getaddrinfo(host, port, fam, socket.SOCK_DGRAM)[0][4]
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(10)
    if mode == "connect":
        s.connect(addr)
    for n in map(int, sys.argv[4:]):
        msg = os.urandom(n)
        s.sendto(msg, addr)
        got, frm = s.recvfrom(65536)
        same = hashlib.sha256(got).digest() == hashlib.sha256(msg).digest()
        peer = mode != "connect" or s.getpeername()[:2] == addr[:2]
        print(fam.name, n, len(got), same, frm[:2] == addr[:2], peer)
    s.close()
`

// udpRefusedClient sends a datagram at a time on a connected socket until
// one fails with ECONNREFUSED, and prints after how many.
const udpRefusedClient = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], int(sys.argv[2])))
s.settimeout(2)
for k in range(1, 6):
    try:
        s.send(b"ping")
        s.recv(100)
        print("answered")
        sys.exit(1)
    except ConnectionRefusedError:
        print("refused after", k, "sends")
        sys.exit(0)
    except socket.timeout:
        pass
print("never refused")
sys.exit(1)
`

// TestExecUDP runs unmodified UDP programs under vlink exec: dig, socat,
// nc, iperf3 -u and Python reach a DNS server and a UDP echo server in a
// site whose firewall drops all UDP from outside, by a name only the site
// resolves and by its address, through the gateway (vlink serve
// --allow-udp), on connected and unconnected sockets. The answers and the
// echoed bytes come back whole, from the address the program sent to; a
// port where nothing listens is ECONNREFUSED.
func TestExecUDP(t *testing.T) {
	testenv.Programs(t, "dnsmasq", "dig", "socat", "nc", "python3", "iperf3", "cc")
	s := newFarSite(t)
	dns := s.start(t, "dnsmasq", "--keep-in-foreground", "--log-facility=-", "--conf-file=/dev/null", "--pid-file",
		"--port", strconv.Itoa(farDNS), "--listen-address", s.farIP.String()+","+s.farIP6.String(), "--bind-interfaces",
		"--no-resolv", "--no-hosts", "--address=/example.test/192.0.2.7")
	dns.WaitFor(t, regexp.MustCompile(`started, version`), startTimeout)
	s.start(t, "socat", "-b65536", fmt.Sprintf("UDP6-RECVFROM:%d,ipv6only=0,fork", farUDPEcho), "PIPE")
	iperf := s.start(t, "iperf3", "-s", "-p", strconv.Itoa(farIperf))
	serve := s.start(t, vlinkBin, "serve", "--listen", s.gateway(), "--log-level", "debug",
		"--allow-udp", "*.vlink.test:*", "--allow-udp", s.farIP.String()+":*", "--allow", fmt.Sprintf("%s:%d", FarName, farIperf))
	s.waitListening(t, iperf, farIperf)
	s.waitListening(t, serve, s.gatewayPort)
	vexec := func(t *testing.T, stdin string, args ...string) string {
		t.Helper()
		full := append([]string{"exec", "--stack", "zstd", "--via", s.gateway(), "--"}, args...)
		out, stderr, err := run(2*time.Minute, strings.NewReader(stdin), vlinkBin, full...)
		if err != nil {
			t.Fatalf("vlink exec %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr)
		}
		return string(out)
	}
	echoAddr := netip.AddrPortFrom(s.farIP, farUDPEcho)

	t.Run("dig", func(t *testing.T) {
		// The site's firewall drops the program's own datagrams.
		if out, _, err := run(time.Minute, nil, "dig", "+short", "+time=1", "+tries=1", "@"+s.farIP.String(), "-p", strconv.Itoa(farDNS), "www.example.test"); err == nil {
			t.Fatalf("dig reached the site without vlink: %s", out)
		}
		for _, server := range []string{FarName, s.farIP.String()} {
			out := vexec(t, "", "dig", "+short", "+time=5", "+tries=1", "@"+server, "-p", strconv.Itoa(farDNS), "www.example.test")
			if strings.TrimSpace(out) != "192.0.2.7" {
				t.Errorf("dig @%s: %q, want 192.0.2.7", server, out)
			}
		}
		serve.WaitFor(t, regexp.MustCompile(`target=`+regexp.QuoteMeta(FarName)+`:`+strconv.Itoa(farDNS)), startTimeout)
	})
	t.Run("socat", func(t *testing.T) {
		// UDP connects its socket; UDP-SENDTO sends with the address.
		for _, addr := range []string{"UDP", "UDP-SENDTO"} {
			out := vexec(t, "through socat\n", "socat", "-t", "2", "-", fmt.Sprintf("%s:%s:%d", addr, FarName, farUDPEcho))
			if out != "through socat\n" {
				t.Errorf("socat %s: %q, want the line echoed", addr, out)
			}
		}
	})
	t.Run("nc", func(t *testing.T) {
		out := vexec(t, "through nc\n", "nc", "-u", "-w", "2", echoAddr.Addr().String(), strconv.Itoa(farUDPEcho))
		if out != "through nc\n" {
			t.Errorf("nc -u: %q, want the line echoed", out)
		}
	})
	t.Run("python", func(t *testing.T) {
		sizes := []string{"1", "1472", "9000", "60000"}
		for _, mode := range []string{"connect", "sendto"} {
			out := vexec(t, "", append([]string{"python3", "-c", execUDPClient, mode, FarName, strconv.Itoa(farUDPEcho)}, sizes...)...)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2*len(sizes) {
				t.Fatalf("%s: python3 printed %q, want a line per datagram and family", mode, out)
			}
			for i, l := range lines {
				fam := [...]string{"AF_INET", "AF_INET6"}[i/len(sizes)]
				n := sizes[i%len(sizes)]
				if want := fmt.Sprintf("%s %s %s True True True", fam, n, n); l != want {
					t.Errorf("%s: %q, want %q (the datagram back whole, from the address sent to)", mode, l, want)
				}
			}
		}
	})
	t.Run("iperf3", func(t *testing.T) {
		// Its test runs on TCP, its datagrams on a connected UDP socket.
		out := vexec(t, "", "iperf3", "-u", "-c", FarName, "-p", strconv.Itoa(farIperf), "-b", "20M", "-l", "1200", "-t", "2", "--json")
		var res struct {
			End struct {
				Sum struct {
					Bytes       int64   `json:"bytes"`
					Packets     int64   `json:"packets"`
					LostPercent float64 `json:"lost_percent"`
				} `json:"sum"`
			} `json:"end"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("iperf3 --json: %v\n%s", err, out)
		}
		// 20 Mbit/s for 2 s is about 4,000 datagrams: the server must
		// have had most of them (a loaded machine drops a few).
		t.Logf("iperf3 -u: %d datagrams, %d bytes, %.2f%% lost", res.End.Sum.Packets, res.End.Sum.Bytes, res.End.Sum.LostPercent)
		if sum := res.End.Sum; sum.Packets < 1000 || sum.LostPercent > 20 {
			t.Errorf("iperf3 -u: %d datagrams, %.1f%% lost, want most of 4,000 received", sum.Packets, sum.LostPercent)
		}
	})
	t.Run("refused", func(t *testing.T) {
		// Without vlink the first send's answer is the refusal; through
		// it, the second's (the datagram that found it is lost).
		out := vexec(t, "", "python3", "-c", udpRefusedClient, FarName, strconv.Itoa(farUDPClosed))
		if strings.TrimSpace(out) != "refused after 2 sends" {
			t.Errorf("a port where nothing listens: %q, want refused after 2 sends", out)
		}
	})
}

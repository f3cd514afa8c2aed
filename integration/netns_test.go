//go:build linux

package integration

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// A farSite is a network namespace standing for a remote site that the
// test's host (the client side) reaches through one veth pair and a
// firewall: the site's nftables accept only its gateway port, and a name,
// FarName, resolves only inside it (/etc/netns/NS/hosts, which
// "ip netns exec" mounts over /etc/hosts). Programs on the host can reach
// the site's servers only through the gateway, vlink serve, started in it.
//
// Names are unique per test process (prefix nsPrefix, then the pid), and a
// new site first deletes what a crashed run left behind, so nothing
// accumulates. It stays apart from the WAN lab (internal/lab): the
// programs under test run on the test's own host, where the preload shim
// and its agent are, and the site needs IPv6, which the lab does not do.
type farSite struct {
	ns            string
	hostIf, farIf string
	hostIP, farIP netip.Addr
	hostIP6       netip.Addr
	farIP6        netip.Addr
	gatewayPort   int
	hostsDir      string // /etc/netns/NS
}

// FarName resolves only inside the far site, FarV4Name too, to its IPv4
// address only.
const (
	FarName   = "far.vlink.test"
	FarV4Name = "v4.far.vlink.test"
)

const nsPrefix = "vlpre"

var siteCount struct {
	sync.Mutex
	n int
}

func sh(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// removeStaleSites deletes namespaces, links and hosts files of earlier
// test processes that are no longer running.
func removeStaleSites() {
	alive := func(name string) bool {
		m := regexp.MustCompile(`^` + nsPrefix + `(\d+)`).FindStringSubmatch(name)
		if m == nil {
			return true
		}
		pid, _ := strconv.Atoi(m[1])
		return pid == os.Getpid() || syscall.Kill(pid, 0) == nil
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], nsPrefix) && !alive(f[0]) {
			exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, m := range regexp.MustCompile(`\d+: (vp\d+h\d+)[@:]`).FindAllStringSubmatch(string(links), -1) {
		pid, _ := strconv.Atoi(strings.TrimPrefix(regexp.MustCompile(`^vp(\d+)h`).FindString(m[1]), "vp"))
		if pid != os.Getpid() && syscall.Kill(pid, 0) != nil {
			exec.Command("ip", "link", "del", m[1]).Run()
		}
	}
	dirs, _ := filepath.Glob("/etc/netns/" + nsPrefix + "*")
	for _, d := range dirs {
		if !alive(filepath.Base(d)) {
			os.RemoveAll(d)
		}
	}
}

// newFarSite builds a far site and registers its removal.
func newFarSite(tb testing.TB) *farSite {
	tb.Helper()
	testenv.Netns(tb, "nft", "ss")
	removeStaleSites()
	siteCount.Lock()
	n := siteCount.n
	siteCount.n++
	siteCount.Unlock()
	pid := os.Getpid()
	// 10.213.0.0/16 in /30s, one per (pid, site); fd0b:1ab::/32 in /64s.
	k := ((pid%4096)*8 + n%8) * 4
	s := &farSite{
		ns:          fmt.Sprintf("%s%d-%d", nsPrefix, pid, n),
		hostIf:      fmt.Sprintf("vp%dh%d", pid, n),
		farIf:       fmt.Sprintf("vp%df%d", pid, n),
		hostIP:      netip.AddrFrom4([4]byte{10, 213, byte(k >> 8), byte(k + 1)}),
		farIP:       netip.AddrFrom4([4]byte{10, 213, byte(k >> 8), byte(k + 2)}),
		hostIP6:     netip.MustParseAddr(fmt.Sprintf("fd0b:1ab:%x:%x::1", pid&0xffff, n)),
		farIP6:      netip.MustParseAddr(fmt.Sprintf("fd0b:1ab:%x:%x::2", pid&0xffff, n)),
		gatewayPort: 7000,
	}
	s.hostsDir = "/etc/netns/" + s.ns
	tb.Cleanup(func() { s.remove() })
	sh(tb, "ip", "netns", "add", s.ns)
	sh(tb, "ip", "link", "add", s.hostIf, "type", "veth", "peer", "name", s.farIf)
	sh(tb, "ip", "link", "set", s.farIf, "netns", s.ns)
	sh(tb, "ip", "addr", "add", s.hostIP.String()+"/30", "dev", s.hostIf)
	sh(tb, "ip", "-6", "addr", "add", s.hostIP6.String()+"/64", "dev", s.hostIf, "nodad")
	sh(tb, "ip", "link", "set", s.hostIf, "up")
	in := func(args ...string) { sh(tb, append([]string{"ip", "netns", "exec", s.ns}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "addr", "add", s.farIP.String()+"/30", "dev", s.farIf)
	in("ip", "-6", "addr", "add", s.farIP6.String()+"/64", "dev", s.farIf, "nodad")
	in("ip", "link", "set", s.farIf, "up")
	// The site's firewall: only the gateway's port is open from outside;
	// other TCP connections are reset, so a bypass fails fast.
	rules := fmt.Sprintf(`table inet vlpre {
  chain input {
    type filter hook input priority 0; policy drop;
    iifname "lo" accept
    ct state established,related accept
    meta l4proto { icmp, ipv6-icmp } accept
    tcp dport %d accept
    meta l4proto tcp reject with tcp reset
  }
}
`, s.gatewayPort)
	cmd := exec.Command("ip", "netns", "exec", s.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("nft: %v\n%s", err, out)
	}
	if err := os.MkdirAll(s.hostsDir, 0o755); err != nil {
		tb.Fatal(err)
	}
	hosts := fmt.Sprintf("127.0.0.1 localhost\n::1 localhost\n%s %s\n%s %s\n%s %s\n", s.farIP, FarName, s.farIP6, FarName, s.farIP, FarV4Name)
	if err := os.WriteFile(filepath.Join(s.hostsDir, "hosts"), []byte(hosts), 0o644); err != nil {
		tb.Fatal(err)
	}
	// The site's own resolver (runDNS), not the host's, which it cannot
	// reach: without one, names it does not know fail fast all the same.
	if err := os.WriteFile(filepath.Join(s.hostsDir, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	return s
}

func (s *farSite) remove() {
	exec.Command("ip", "netns", "del", s.ns).Run() // takes the veth pair along
	exec.Command("ip", "link", "del", s.hostIf).Run()
	os.RemoveAll(s.hostsDir)
}

// runDNS starts the site's resolver, which answers every name it is
// asked with NXDOMAIN: the names the site knows are in its hosts file.
func (s *farSite) runDNS(tb testing.TB) {
	tb.Helper()
	p := s.start(tb, "python3", "-u", "testdata/nxdomain.py", "127.0.0.1")
	p.WaitFor(tb, regexp.MustCompile(`listening`), 30*time.Second)
}

// start runs a program inside the site, with the harness's cleanup.
func (s *farSite) start(tb testing.TB, name string, args ...string) *proc {
	tb.Helper()
	p := startProc(tb, "ip", append([]string{"netns", "exec", s.ns, name}, args...)...)
	p.Name = filepath.Base(name) + "@far"
	return p
}

// listening waits until a TCP socket in the site listens on port.
func (s *farSite) waitListening(tb testing.TB, p *proc, port int) {
	tb.Helper()
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^LISTEN\s.*:%d\s`, port))
	for i := 0; ; i++ {
		out, _ := exec.Command("ip", "netns", "exec", s.ns, "ss", "-Hltn").Output()
		if re.Match(out) {
			return
		}
		if !p.Running() {
			tb.Fatalf("%s exited (%v) before listening on %d; output:\n%s", p, p.Err(), port, realserver.Tail(p.Output(), 4000))
		}
		if i > 1500 {
			tb.Fatalf("%s not listening on %d; output:\n%s", p, port, realserver.Tail(p.Output(), 4000))
		}
		sleepMillis(10)
	}
}

// gateway returns the address of the site's vlink serve, as the host
// reaches it.
func (s *farSite) gateway() string {
	return netip.AddrPortFrom(s.farIP, uint16(s.gatewayPort)).String()
}

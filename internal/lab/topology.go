package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"
)

// ErrTopology is wrapped by every error Validate returns.
var ErrTopology = errors.New("invalid topology")

// Limits of a topology.
const (
	MaxHosts    = 64
	MaxLinks    = 250 // one 10.77.N.0/24 subnet per link
	MaxHostName = 12  // device names are "to-" + a peer's name, and Linux allows 15 bytes

	maxDelay = 10 * time.Second
	maxRate  = 100 * Gbit
	maxQueue = 1 << 30
)

// A Topology is a lab: hosts, each in its own network namespace, and the
// links that join them. The zero value is not a valid topology: it needs
// at least one host.
type Topology struct {
	// Name is shown by List and the command's list; optional.
	Name string `toml:"name,omitempty"`
	// About says what the topology is for; optional.
	About string `toml:"about,omitempty"`
	// Hosts are the namespaces, in order; Addr of a host is its address
	// on its first link.
	Hosts []Host `toml:"host"`
	// Links join pairs of hosts. Every host reaches every other host's
	// addresses through the shortest path of links (hosts in between
	// forward).
	Links []Link `toml:"link,omitempty"`
	// Sysctls are set in every host's namespace, before the host's own:
	// keys as sysctl(8) writes them ("net.ipv4.tcp_rmem"), values as
	// written to /proc/sys. Only per-namespace settings can be changed
	// (net.ipv4.tcp_*, net.ipv4.conf.*, net.core.somaxconn, ...).
	Sysctls map[string]string `toml:"sysctls,omitempty"`
	// Seed seeds the delay lines' random loss and jitter, so that a run
	// can be repeated; 0 picks a random seed.
	Seed uint64 `toml:"seed,omitempty"`
}

// A Host is one network namespace.
type Host struct {
	// Name: 1 to 12 of a-z, 0-9 and '-', starting with a letter.
	Name string `toml:"name"`
	// Sysctls override the topology's for this host.
	Sysctls map[string]string `toml:"sysctls,omitempty"`
	// Firewall, if set, makes the host a stateful firewall; nil accepts
	// everything.
	Firewall *Firewall `toml:"firewall,omitempty"`
}

// A Link joins hosts A and B. A link without delay, jitter or loss in
// either direction is a veth pair (the kernel forwards; nothing to
// measure). Any of them makes it a delay line: a TUN device in each host
// and a forwarder between them that holds each packet for its delay
// (see the package documentation).
//
// The link-level fields describe both directions; AtoB or BtoA, when
// set, describe that direction instead (entirely: they are not merged
// with the link-level fields).
type Link struct {
	A string `toml:"a"`
	B string `toml:"b"`
	// Rate limits each direction to this many bit/s with tbf; 0: no limit.
	Rate Bitrate `toml:"rate,omitempty"`
	// FlowRate caps each flow (each TCP connection, by its addresses and
	// ports) to this many bit/s under Rate, as a per-flow shaper in the
	// middle of a path does: fq's maxrate under the tbf, with a queue
	// per flow. 0: no cap. Needs Rate.
	FlowRate Bitrate `toml:"flow_rate,omitempty"`
	// RTT is the round-trip time the link adds: half of it each way.
	RTT Duration `toml:"rtt,omitempty"`
	// Jitter varies each packet's one-way delay uniformly within
	// ±Jitter, without reordering.
	Jitter Duration `toml:"jitter,omitempty"`
	// Loss is the probability that each packet (each TCP segment) is
	// dropped, independently, in each direction.
	Loss Loss `toml:"loss,omitempty"`
	// Buffer is the bottleneck's buffer (tbf's queue) when Rate is set:
	// packets beyond it are dropped. 0: one bandwidth-delay product
	// (Rate × RTT), at least 64K.
	Buffer Size `toml:"buffer,omitempty"`
	// Queue bounds the bytes a delay line holds in each direction (what
	// is in flight on the wire); beyond it, packets are dropped. 0: twice
	// what the line holds at Rate (or 10gbit without one), plus 1M.
	Queue Size `toml:"queue,omitempty"`
	// DelayLine makes the link a delay line even when it delays and
	// loses nothing: to measure the delay line itself.
	DelayLine bool `toml:"delay_line,omitempty"`

	AtoB *Shape `toml:"a_to_b,omitempty"`
	BtoA *Shape `toml:"b_to_a,omitempty"`
}

// A Shape is what one direction of a link does to packets.
type Shape struct {
	Rate     Bitrate  `toml:"rate,omitempty"`
	FlowRate Bitrate  `toml:"flow_rate,omitempty"`
	Delay    Duration `toml:"delay,omitempty"` // one-way
	Jitter   Duration `toml:"jitter,omitempty"`
	Loss     Loss     `toml:"loss,omitempty"`
	Buffer   Size     `toml:"buffer,omitempty"`
	Queue    Size     `toml:"queue,omitempty"`
}

// Shapes returns what the link does from A to B and from B to A, with
// the defaults filled in.
func (l Link) Shapes() (ab, ba Shape) {
	base := Shape{Rate: l.Rate, FlowRate: l.FlowRate, Delay: l.RTT / 2, Jitter: l.Jitter, Loss: l.Loss, Buffer: l.Buffer, Queue: l.Queue}
	ab, ba = base, base
	if l.AtoB != nil {
		ab = *l.AtoB
	}
	if l.BtoA != nil {
		ba = *l.BtoA
	}
	rtt := ab.Delay.D() + ba.Delay.D()
	return ab.withDefaults(rtt), ba.withDefaults(rtt)
}

func (s Shape) withDefaults(rtt time.Duration) Shape {
	if s.Rate > 0 && s.Buffer == 0 {
		s.Buffer = Size(max(s.Rate.BytesPer(rtt), 64<<10))
	}
	if s.Queue == 0 {
		r := s.Rate
		if r == 0 {
			r = 10 * Gbit
		}
		s.Queue = Size(min(2*r.BytesPer(s.Delay.D()+s.Jitter.D())+1<<20, maxQueue))
	}
	return s
}

// delayed reports whether the shape needs a delay line.
func (s Shape) delayed() bool { return s.Delay > 0 || s.Jitter > 0 || s.Loss > 0 }

// Delayed reports whether the link is a delay line rather than a veth pair.
func (l Link) Delayed() bool {
	ab, ba := l.Shapes()
	return l.DelayLine || ab.delayed() || ba.delayed()
}

func (s Shape) String() string {
	var parts []string
	if s.Rate > 0 {
		parts = append(parts, "rate "+s.Rate.String())
	}
	if s.FlowRate > 0 {
		parts = append(parts, "each flow at most "+s.FlowRate.String())
	}
	if s.Delay > 0 {
		parts = append(parts, "delay "+s.Delay.String())
	}
	if s.Jitter > 0 {
		parts = append(parts, "jitter ±"+s.Jitter.String())
	}
	if s.Loss > 0 {
		parts = append(parts, "loss "+s.Loss.String())
	}
	if len(parts) == 0 {
		return "unshaped"
	}
	return strings.Join(parts, ", ")
}

// A Firewall is a stateful nftables ruleset on a host's input and forward
// hooks: packets of established and related connections pass, and new
// connections are accepted only to the Open ports, or from Trusted
// neighbours. Everything the host sends is allowed. ICMP passes (path MTU
// discovery needs it).
type Firewall struct {
	// Open lists what new connections from anywhere may reach, on this
	// host or through it: "tcp/5201", "udp/53", "tcp/7000-7010".
	Open []string `toml:"open,omitempty"`
	// Trust names neighbours (hosts linked to this one) whose traffic is
	// accepted as the host's own, new connections included: a firewall
	// between a trusted inside and the rest.
	Trust []string `toml:"trust,omitempty"`
	// NAT, if set, rewrites the source of what the host sends out to its
	// untrusted neighbours to its own address there, as a home or site
	// router does (nft masquerade): "masquerade" keeps each connection's
	// source port where it can; "random" picks a new one for every
	// connection (fully-random), as NATs that change ports per
	// destination do. It needs Trust: the inside.
	NAT string `toml:"nat,omitempty"`
	// Ruleset, when set, is loaded instead (nft syntax, as "nft -f"
	// reads it); Open, Trust and NAT must then be empty.
	Ruleset string `toml:"ruleset,omitempty"`
}

var (
	hostNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,11}$`)
	sysctlRE   = regexp.MustCompile(`^[a-z0-9_]+(\.[a-zA-Z0-9_-]+)+$`)
	portRE     = regexp.MustCompile(`^(tcp|udp|sctp)/([0-9]{1,5})(?:-([0-9]{1,5}))?$`)
)

// Validate checks the topology; its errors wrap ErrTopology and name the
// host or link at fault.
func (t *Topology) Validate() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrTopology, fmt.Sprintf(format, args...))
	}
	if len(t.Name) > 64 || strings.ContainsFunc(t.Name, isControl) {
		return fail("name %q: at most 64 printable characters", t.Name)
	}
	if len(t.Hosts) == 0 {
		return fail("no hosts")
	}
	if len(t.Hosts) > MaxHosts {
		return fail("%d hosts, at most %d", len(t.Hosts), MaxHosts)
	}
	if len(t.Links) > MaxLinks {
		return fail("%d links, at most %d", len(t.Links), MaxLinks)
	}
	if err := checkSysctls(t.Sysctls); err != nil {
		return fail("sysctls: %v", err)
	}
	hosts := make(map[string]bool, len(t.Hosts))
	for i, h := range t.Hosts {
		if !hostNameRE.MatchString(h.Name) {
			return fail("host %d: name %q: want 1 to %d of a-z, 0-9 and '-', starting with a letter", i+1, h.Name, MaxHostName)
		}
		if hosts[h.Name] {
			return fail("host %q defined twice", h.Name)
		}
		hosts[h.Name] = true
		if err := checkSysctls(h.Sysctls); err != nil {
			return fail("host %q: sysctls: %v", h.Name, err)
		}
	}
	pairs := make(map[[2]string]bool)
	for i, l := range t.Links {
		name := fmt.Sprintf("link %d (%s-%s)", i+1, l.A, l.B)
		if !hosts[l.A] || !hosts[l.B] {
			return fail("%s: both ends must be hosts of the topology", name)
		}
		if l.A == l.B {
			return fail("%s: a link joins two different hosts", name)
		}
		pair := [2]string{min(l.A, l.B), max(l.A, l.B)}
		if pairs[pair] {
			return fail("%s: %s and %s are already linked", name, l.A, l.B)
		}
		pairs[pair] = true
		if (l.AtoB != nil || l.BtoA != nil) && (l.Rate != 0 || l.FlowRate != 0 || l.RTT != 0 || l.Jitter != 0 || l.Loss != 0 || l.Buffer != 0 || l.Queue != 0) {
			// Not merged: say so rather than silently ignore half of it.
			if l.AtoB == nil || l.BtoA == nil {
				return fail("%s: with a_to_b or b_to_a, set both directions and no link-level shape", name)
			}
			return fail("%s: a_to_b and b_to_a replace the link-level shape; remove the link-level fields", name)
		}
		if l.AtoB != nil && l.BtoA == nil || l.AtoB == nil && l.BtoA != nil {
			return fail("%s: with a_to_b or b_to_a, set both directions", name)
		}
		if l.RTT.D() > 2*maxDelay {
			return fail("%s: rtt %v, at most %v", name, l.RTT, 2*maxDelay)
		}
		ab, ba := l.Shapes()
		for _, d := range []struct {
			dir string
			s   Shape
		}{{l.A + "->" + l.B, ab}, {l.B + "->" + l.A, ba}} {
			if err := d.s.check(); err != nil {
				return fail("%s: %s: %v", name, d.dir, err)
			}
		}
	}
	neighbours := make(map[string]map[string]bool)
	for _, l := range t.Links {
		for _, p := range [][2]string{{l.A, l.B}, {l.B, l.A}} {
			if neighbours[p[0]] == nil {
				neighbours[p[0]] = make(map[string]bool)
			}
			neighbours[p[0]][p[1]] = true
		}
	}
	for _, h := range t.Hosts {
		if h.Firewall == nil {
			continue
		}
		if err := h.Firewall.check(neighbours[h.Name]); err != nil {
			return fail("host %q: firewall: %v", h.Name, err)
		}
	}
	// A host alone is a lab; a host among others with no link reaches
	// none of them, and has no address to show.
	if len(t.Hosts) > 1 {
		for _, h := range t.Hosts {
			if len(neighbours[h.Name]) == 0 {
				return fail("host %q has no link: in a lab of several hosts, each needs a [[link]] to another (a = %q, b = ...)", h.Name, h.Name)
			}
		}
	}
	return nil
}

func (s Shape) check() error {
	switch {
	case s.Rate > maxRate:
		return fmt.Errorf("rate %v, at most %v", s.Rate, maxRate)
	case s.Rate > 0 && s.Rate < 8*Kbit:
		return fmt.Errorf("rate %v, at least 8kbit", s.Rate)
	case s.FlowRate > 0 && s.Rate == 0:
		return fmt.Errorf("flow_rate %v without a rate: set the link's rate too", s.FlowRate)
	case s.FlowRate > s.Rate:
		return fmt.Errorf("flow_rate %v above the rate %v", s.FlowRate, s.Rate)
	case s.FlowRate > 0 && s.FlowRate < 8*Kbit:
		return fmt.Errorf("flow_rate %v, at least 8kbit", s.FlowRate)
	case s.Delay.D() > maxDelay:
		return fmt.Errorf("delay %v, at most %v", s.Delay, maxDelay)
	case s.Jitter.D() > maxDelay:
		return fmt.Errorf("jitter %v, at most %v", s.Jitter, maxDelay)
	case !(s.Loss >= 0 && s.Loss <= 1):
		return fmt.Errorf("loss %v, want 0%% to 100%%", s.Loss)
	case s.Buffer < 0 || s.Buffer > maxQueue:
		return fmt.Errorf("buffer %v, at most %v", s.Buffer, Size(maxQueue))
	case s.Buffer > 0 && s.Buffer < 2048:
		return fmt.Errorf("buffer %v, at least 2K (one packet)", s.Buffer)
	case s.Queue < 0 || s.Queue > maxQueue:
		return fmt.Errorf("queue %v, at most %v", s.Queue, Size(maxQueue))
	case s.Queue > 0 && s.Queue < 128<<10:
		return fmt.Errorf("queue %v, at least 128K (two of the largest packets)", s.Queue)
	}
	return nil
}

func (f *Firewall) check(neighbours map[string]bool) error {
	if f.Ruleset != "" {
		if len(f.Open) > 0 || len(f.Trust) > 0 || f.NAT != "" {
			return errors.New("ruleset replaces open, trust and nat; set one or the others")
		}
		return nil
	}
	switch f.NAT {
	case "", "masquerade", "random":
	default:
		return fmt.Errorf("nat %q: want masquerade or random", f.NAT)
	}
	if f.NAT != "" && len(f.Trust) == 0 {
		return fmt.Errorf("nat %q needs trust: the neighbours on the inside", f.NAT)
	}
	for _, p := range f.Open {
		if _, _, _, err := parsePorts(p); err != nil {
			return err
		}
	}
	for _, n := range f.Trust {
		if !neighbours[n] {
			return fmt.Errorf("trust %q: not a host linked to this one", n)
		}
	}
	return nil
}

// parsePorts parses "tcp/80" or "udp/7000-7010".
func parsePorts(s string) (proto string, lo, hi int, err error) {
	m := portRE.FindStringSubmatch(s)
	if m == nil {
		return "", 0, 0, fmt.Errorf("open %q: want PROTO/PORT or PROTO/LOW-HIGH, PROTO one of tcp, udp, sctp", s)
	}
	fmt.Sscan(m[2], &lo)
	hi = lo
	if m[3] != "" {
		fmt.Sscan(m[3], &hi)
	}
	if lo < 1 || hi > 65535 || hi < lo {
		return "", 0, 0, fmt.Errorf("open %q: ports from 1 to 65535, low before high", s)
	}
	return m[1], lo, hi, nil
}

func checkSysctls(m map[string]string) error {
	for k, v := range m {
		if !sysctlRE.MatchString(k) || strings.Contains(k, "..") {
			return fmt.Errorf("key %q: want dotted names like net.ipv4.tcp_rmem", k)
		}
		if !strings.HasPrefix(k, "net.") {
			return fmt.Errorf("key %q: only net.* settings belong to a network namespace", k)
		}
		if len(v) > 256 || strings.ContainsFunc(v, isControl) {
			return fmt.Errorf("%s: value %q: one line, at most 256 bytes", k, v)
		}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }

// linkAddrs returns the addresses of A and B on link i: 10.77.i.1 and
// 10.77.i.2. Labs are separate namespaces, so every lab uses the same
// plan.
func linkAddrs(i int) (a, b netip.Addr) {
	return netip.AddrFrom4([4]byte{10, 77, byte(i), 1}), netip.AddrFrom4([4]byte{10, 77, byte(i), 2})
}

// devName is the name of host's device on its link to peer.
func devName(peer string) string { return "to-" + peer }

// ifbName is the name of the ifb device that shapes what host receives
// from peer.
func ifbName(peer string) string { return "in-" + peer }

// A route is one entry of a host's routing table: dst/32 via gw, the
// neighbour's address on the link to it.
type route struct {
	dst, gw netip.Addr
	dev     string
}

// plan is the addressing of a validated topology.
type plan struct {
	addrs  map[string][]netip.Addr // host -> its addresses, in link order
	routes map[string][]route      // host -> routes to non-adjacent addresses
	// forwards: hosts on a path between two others, which need
	// ip_forward.
	forwards map[string]bool
}

// makePlan computes the addresses and routes: each host reaches every
// address of every other host through a shortest path (breadth-first,
// ties broken by link order, so the plan is deterministic).
func makePlan(t *Topology) plan {
	p := plan{addrs: map[string][]netip.Addr{}, routes: map[string][]route{}, forwards: map[string]bool{}}
	type edge struct {
		peer     string
		peerAddr netip.Addr
	}
	adj := map[string][]edge{}
	owner := map[netip.Addr]string{}
	var all []netip.Addr
	for i, l := range t.Links {
		a, b := linkAddrs(i)
		p.addrs[l.A] = append(p.addrs[l.A], a)
		p.addrs[l.B] = append(p.addrs[l.B], b)
		adj[l.A] = append(adj[l.A], edge{l.B, b})
		adj[l.B] = append(adj[l.B], edge{l.A, a})
		owner[a], owner[b] = l.A, l.B
		all = append(all, a, b)
	}
	for _, h := range t.Hosts {
		// first hop from h toward every host, by BFS
		first := map[string]edge{}
		prev := map[string]string{h.Name: ""}
		queue := []string{h.Name}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			for _, e := range adj[n] {
				if _, seen := prev[e.peer]; seen {
					continue
				}
				prev[e.peer] = n
				if n == h.Name {
					first[e.peer] = e
				} else {
					first[e.peer] = first[n]
					p.forwards[n] = true
				}
				queue = append(queue, e.peer)
			}
		}
		adjacent := map[netip.Addr]bool{}
		for _, e := range adj[h.Name] {
			adjacent[e.peerAddr] = true
		}
		for _, a := range all {
			o := owner[a]
			if o == h.Name || adjacent[a] {
				continue
			}
			hop, ok := first[o]
			if !ok {
				continue // not connected
			}
			p.routes[h.Name] = append(p.routes[h.Name], route{dst: a, gw: hop.peerAddr, dev: devName(hop.peer)})
		}
	}
	return p
}

package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/procnet"
)

type labSys struct {
	lines  []*delayLine
	links  []int      // topology index of each delay line's link
	shapes [][2]Shape // each link's current shapes (A to B, B to A)
}

var labSeq atomic.Int64

// Supported reports whether this process can bring labs up: it must be
// root (network namespaces need CAP_SYS_ADMIN, devices CAP_NET_ADMIN),
// with /dev/net/tun and iproute2's ip. The error says what is missing.
func Supported() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces and devices)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("the lab needs /dev/net/tun: %w", err)
	}
	return needPrograms("ip")
}

// Programs returns the programs the topology needs on PATH: ip always,
// tc for rate limits, nft for firewalls.
func (t *Topology) Programs() []string {
	progs := []string{"ip"}
	var tc, nft bool
	for _, l := range t.Links {
		ab, ba := l.Shapes()
		tc = tc || ab.Rate > 0 || ba.Rate > 0
	}
	for _, h := range t.Hosts {
		nft = nft || h.Firewall != nil
	}
	if tc {
		progs = append(progs, "tc")
	}
	if nft {
		progs = append(progs, "nft")
	}
	return progs
}

func needPrograms(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the lab needs %s on PATH (integration/deps.sh installs iproute2 and nftables)", strings.Join(missing, ", "))
	}
	return nil
}

// Up brings a topology up and returns the lab. Labs whose owner died are
// removed first. ctx bounds the setup only; the lab stays up until Close
// (or until this process ends, after which the next Up or Clean removes
// it). If setup fails, whatever was made is removed.
func Up(ctx context.Context, topo Topology) (*Lab, error) {
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	if err := needPrograms(topo.Programs()...); err != nil {
		return nil, err
	}
	Clean() // best effort: a stale lab must not stop a new one
	l := &Lab{
		id:    fmt.Sprintf("%d-%d", os.Getpid(), labSeq.Add(1)-1),
		topo:  topo,
		plan:  makePlan(&topo),
		hosts: make(map[string]*labHost, len(topo.Hosts)),
	}
	for _, h := range topo.Hosts {
		l.order = append(l.order, h.Name)
		l.hosts[h.Name] = &labHost{name: h.Name, netns: netnsName(l.id, h.Name), addrs: l.plan.addrs[h.Name], nsfd: -1}
	}
	if err := l.up(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("lab %s: %w", l.id, err)
	}
	return l, nil
}

func (l *Lab) up(ctx context.Context) error {
	if err := l.writeState(); err != nil {
		return err
	}
	for _, name := range l.order {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.addHost(ctx, l.hosts[name]); err != nil {
			return err
		}
	}
	seed := l.topo.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	for i, link := range l.topo.Links {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.addLink(ctx, i, link, seed+uint64(i)*0x9e3779b97f4a7c15); err != nil {
			return fmt.Errorf("link %s-%s: %w", link.A, link.B, err)
		}
	}
	for _, h := range l.topo.Hosts {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.configureHost(ctx, h); err != nil {
			return fmt.Errorf("host %s: %w", h.Name, err)
		}
	}
	return nil
}

// addHost makes the host's namespace, with loopback up and IPv6 off (so
// that no router solicitation or multicast report crosses a delay line
// and its counters).
func (l *Lab) addHost(ctx context.Context, h *labHost) error {
	if err := runCmd(ctx, "", "ip", "netns", "add", h.netns); err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join(netnsDir, h.netns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening namespace %s: %w", h.netns, err)
	}
	l.mu.Lock()
	h.nsfd = fd
	l.mu.Unlock()
	if err := runCmd(ctx, "", "ip", "-n", h.netns, "link", "set", "lo", "up"); err != nil {
		return err
	}
	return inNetns(fd, func() error {
		for _, k := range []string{"net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"} {
			if err := writeSysctl(k, "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return nil
	})
}

// addLink joins the link's hosts: a veth pair, or two TUN devices and a
// delay line; then the rate limits, on the receiving side of each
// direction.
func (l *Lab) addLink(ctx context.Context, i int, link Link, seed uint64) error {
	ha, hb := l.hosts[link.A], l.hosts[link.B]
	devA, devB := devName(link.B), devName(link.A)
	addrA, addrB := linkAddrs(i)
	ab, ba := link.Shapes()
	l.mu.Lock()
	l.sys.shapes = append(l.sys.shapes, [2]Shape{ab, ba})
	l.mu.Unlock()
	if link.Delayed() {
		ta, err := openTUN(ha.nsfd, devA)
		if err != nil {
			return err
		}
		tb, err := openTUN(hb.nsfd, devB)
		if err != nil {
			ta.Close()
			return err
		}
		for _, s := range []struct {
			h          *labHost
			dev        string
			addr, peer netip.Addr
		}{{ha, devA, addrA, addrB}, {hb, devB, addrB, addrA}} {
			if err := runCmd(ctx, "", "ip", "-n", s.h.netns, "addr", "add", s.addr.String()+"/32", "peer", s.peer.String()+"/32", "dev", s.dev); err != nil {
				ta.Close()
				tb.Close()
				return err
			}
			if err := runCmd(ctx, "", "ip", "-n", s.h.netns, "link", "set", s.dev, "mtu", "1500", "txqueuelen", "1000", "up"); err != nil {
				ta.Close()
				tb.Close()
				return err
			}
		}
		d := newDelayLine(ta, tb, ab, ba, seed)
		l.mu.Lock()
		l.sys.lines = append(l.sys.lines, d)
		l.sys.links = append(l.sys.links, i)
		l.mu.Unlock()
	} else {
		if err := runCmd(ctx, "", "ip", "link", "add", devA, "netns", ha.netns, "type", "veth", "peer", "name", devB, "netns", hb.netns); err != nil {
			return err
		}
		for _, s := range []struct {
			h    *labHost
			dev  string
			addr netip.Addr
		}{{ha, devA, addrA}, {hb, devB, addrB}} {
			if err := runCmd(ctx, "", "ip", "-n", s.h.netns, "addr", "add", s.addr.String()+"/24", "dev", s.dev); err != nil {
				return err
			}
			if err := runCmd(ctx, "", "ip", "-n", s.h.netns, "link", "set", s.dev, "up"); err != nil {
				return err
			}
		}
	}
	// A→B is shaped where B receives it, B→A where A does.
	if err := shapeIngress(ctx, hb.netns, devB, ifbName(link.A), ab, true); err != nil {
		return err
	}
	return shapeIngress(ctx, ha.netns, devA, ifbName(link.B), ba, false)
}

// shapeIngress limits what dev receives to s.Rate: its ingress is
// redirected to an ifb device whose egress has a token bucket (tbf) with
// s.Buffer bytes of queue. Shaping on the receiving side puts the
// bottleneck's queue outside the sender's host, as on a real path: the
// sender's TCP learns of it by loss and delay, not by the local
// back-pressure (TCP small queues) that a queue on its own device gives.
func shapeIngress(ctx context.Context, ns, dev, ifb string, s Shape, fromA bool) error {
	if s.Rate == 0 {
		return nil
	}
	steps := [][]string{
		{"ip", "-n", ns, "link", "add", ifb, "type", "ifb"},
		{"ip", "-n", ns, "link", "set", ifb, "up"},
		{"tc", "-n", ns, "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"},
		// u32 matching everything: matchall is not built into every
		// kernel (this one lacks it), u32 nearly always is.
		{"tc", "-n", ns, "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all",
			"u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb},
		append([]string{"tc", "-n", ns, "qdisc", "add", "dev", ifb, "root"}, tbfArgs(s)...),
	}
	if s.FlowRate > 0 {
		steps = steps[:len(steps)-1]
	}
	for _, st := range steps {
		if err := runCmd(ctx, "", st[0], st[1:]...); err != nil {
			return err
		}
	}
	if s.FlowRate > 0 {
		return runCmd(ctx, flowShaper(ifb, s, fromA), "tc", "-n", ns, "-batch", "-")
	}
	return nil
}

// flowBuckets is how many flows the per-flow shaper tells apart.
const flowBuckets = 256

// flowShaper is a tc batch that shapes what ifb sends to s.Rate in all
// and each TCP flow to s.FlowRate, as a shaper with a queue per flow
// does. This kernel has neither fq nor sfq, so it is htb: a class for
// the link, flowBuckets classes under it that may borrow up to FlowRate
// each, and a u32 hash on the A side's port choosing the class. The
// ports of A's connections are told apart by bits 1 to 8 (Linux gives
// the connections a process makes to one destination consecutive even
// ports), so up to 256 connections from A each get a class of their own;
// beyond that, or with ports 512 apart, they share one. Each class queues
// one bandwidth-delay product at FlowRate; packets beyond it are dropped.
// Anything that is not TCP over IPv4 goes to a class of its own.
func flowShaper(ifb string, s Shape, fromA bool) string {
	var b strings.Builder
	rate := func(r Bitrate) string { return strconv.FormatUint(uint64(r), 10) + "bit" }
	burst := max(s.Rate.BytesPer(time.Millisecond), 32<<10)
	flowBurst := max(s.FlowRate.BytesPer(time.Millisecond), 32<<10)
	queue := max(s.FlowRate.BytesPer(2*s.Delay.D()), 64<<10)
	share := max(s.Rate/flowBuckets, 8*Kbit)
	fmt.Fprintf(&b, "qdisc add dev %s root handle 1: htb default 2\n", ifb)
	fmt.Fprintf(&b, "class add dev %s parent 1: classid 1:1 htb rate %s ceil %s burst %d cburst %d\n", ifb, rate(s.Rate), rate(s.Rate), burst, burst)
	fmt.Fprintf(&b, "class add dev %s parent 1:1 classid 1:2 htb rate %s ceil %s burst %d cburst %d\n", ifb, rate(share), rate(s.Rate), burst, burst)
	fmt.Fprintf(&b, "qdisc add dev %s parent 1:2 bfifo limit %d\n", ifb, int64(s.Buffer))
	for i := range flowBuckets {
		fmt.Fprintf(&b, "class add dev %s parent 1:1 classid 1:%x htb rate %s ceil %s burst %d cburst %d\n", ifb, 0x100+i, rate(share), rate(s.FlowRate), flowBurst, flowBurst)
		fmt.Fprintf(&b, "qdisc add dev %s parent 1:%x bfifo limit %d\n", ifb, 0x100+i, queue)
	}
	// The hash: TCP's ports are the 32 bits at offset 20 (the lab's
	// packets carry no IP options); A's port is the source when A sends.
	mask := "0x000001fe"
	if fromA {
		mask = "0x01fe0000"
	}
	fmt.Fprintf(&b, "filter add dev %s parent 1: prio 1 handle 2: protocol ip u32 divisor %d\n", ifb, flowBuckets)
	fmt.Fprintf(&b, "filter add dev %s parent 1: prio 1 protocol ip u32 ht 800:: match ip protocol 6 0xff hashkey mask %s at 20 link 2:\n", ifb, mask)
	for i := range flowBuckets {
		fmt.Fprintf(&b, "filter add dev %s parent 1: prio 1 protocol ip u32 ht 2:%x: match u32 0 0 flowid 1:%x\n", ifb, i, 0x100+i)
	}
	return b.String()
}

// SetLink changes what the link between hosts a and b does, while the
// lab runs: ab for packets from a to b, ba for the other way. Rate and
// Buffer can change on any link; Delay, Jitter and Loss only on a delay
// line (a veth pair cannot delay; bring the lab up with a delay line,
// DelayLine if need be). Queue cannot change (the line's ring is sized
// when it starts). Zero Buffer and Queue take their defaults. Packets
// already in flight keep the delay they were given.
func (l *Lab) SetLink(ctx context.Context, a, b string, ab, ba Shape) error {
	idx := slices.IndexFunc(l.topo.Links, func(k Link) bool { return k.A == a && k.B == b || k.A == b && k.B == a })
	if idx < 0 {
		return fmt.Errorf("lab %s: no link between %q and %q", l.id, a, b)
	}
	link := l.topo.Links[idx]
	if link.A != a {
		ab, ba = ba, ab
	}
	rtt := ab.Delay.D() + ba.Delay.D()
	ab, ba = ab.withDefaults(rtt), ba.withDefaults(rtt)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("lab %s: %w", l.id, ErrClosed)
	}
	cur := l.sys.shapes[idx]
	var line *delayLine
	for k, li := range l.sys.links {
		if li == idx {
			line = l.sys.lines[k]
		}
	}
	for k, s := range []*Shape{&ab, &ba} {
		if err := s.check(); err != nil {
			return fmt.Errorf("lab %s: link %s-%s: %v", l.id, link.A, link.B, err)
		}
		if line == nil && s.delayed() {
			return fmt.Errorf("lab %s: link %s-%s is a veth pair: it cannot delay or lose packets (make it a delay line)", l.id, link.A, link.B)
		}
		if line != nil {
			s.Queue = cur[k].Queue
		}
	}
	ha, hb := l.hosts[link.A], l.hosts[link.B]
	if err := reshapeIngress(ctx, hb.netns, devName(link.A), ifbName(link.A), cur[0], ab, true); err != nil {
		return err
	}
	if err := reshapeIngress(ctx, ha.netns, devName(link.B), ifbName(link.B), cur[1], ba, false); err != nil {
		return err
	}
	if line != nil {
		line.ab.shape.Store(&ab)
		line.ba.shape.Store(&ba)
	}
	l.sys.shapes[idx] = [2]Shape{ab, ba}
	return nil
}

// reshapeIngress moves dev's ingress shaping from old to s.
func reshapeIngress(ctx context.Context, ns, dev, ifb string, old, s Shape, fromA bool) error {
	switch {
	case old.Rate == s.Rate && old.Buffer == s.Buffer && old.FlowRate == s.FlowRate:
		return nil
	case old.Rate == 0:
		return shapeIngress(ctx, ns, dev, ifb, s, fromA)
	case old.FlowRate != 0 || s.FlowRate != 0:
		// htb under a flow cap: take it down and build it again
		if err := runCmd(ctx, "", "tc", "-n", ns, "qdisc", "del", "dev", dev, "handle", "ffff:", "ingress"); err != nil {
			return err
		}
		if err := runCmd(ctx, "", "ip", "-n", ns, "link", "del", ifb); err != nil {
			return err
		}
		return shapeIngress(ctx, ns, dev, ifb, s, fromA)
	case s.Rate == 0:
		if err := runCmd(ctx, "", "tc", "-n", ns, "qdisc", "del", "dev", dev, "handle", "ffff:", "ingress"); err != nil {
			return err
		}
		return runCmd(ctx, "", "ip", "-n", ns, "link", "del", ifb)
	}
	return runCmd(ctx, "", "tc", append([]string{"-n", ns, "qdisc", "change", "dev", ifb, "root"}, tbfArgs(s)...)...)
}

// tbfArgs are tc's arguments for a token bucket shaping to s.Rate. The
// bucket holds 1 ms at the rate, and at least 32K: enough for the 64K
// super-packets of TSO to pass whole most of the time (tbf cuts larger
// ones into segments).
func tbfArgs(s Shape) []string {
	burst := max(s.Rate.BytesPer(time.Millisecond), 32<<10)
	return []string{"tbf", "rate", strconv.FormatUint(uint64(s.Rate), 10) + "bit",
		"burst", strconv.FormatInt(burst, 10), "limit", strconv.FormatInt(int64(s.Buffer), 10)}
}

// configureHost sets the host's sysctls, routes and firewall.
func (l *Lab) configureHost(ctx context.Context, h Host) error {
	lh := l.hosts[h.Name]
	settings := [][2]string{}
	if l.plan.forwards[h.Name] {
		settings = append(settings, [2]string{"net.ipv4.ip_forward", "1"})
	}
	for _, m := range []map[string]string{l.topo.Sysctls, h.Sysctls} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			settings = append(settings, [2]string{k, m[k]})
		}
	}
	for _, kv := range settings {
		err := inNetns(lh.nsfd, func() error { return writeSysctl(kv[0], kv[1]) })
		if kv[0] == ccKey && errors.Is(err, os.ErrPermission) {
			if aerr := allowCongestionControl(kv[1]); aerr != nil {
				return fmt.Errorf("%w (and adding %s to net.ipv4.tcp_allowed_congestion_control: %v)", err, kv[1], aerr)
			}
			err = inNetns(lh.nsfd, func() error { return writeSysctl(kv[0], kv[1]) })
		}
		if err != nil {
			return err
		}
	}
	for _, r := range l.plan.routes[h.Name] {
		if err := runCmd(ctx, "", "ip", "-n", lh.netns, "route", "add", r.dst.String()+"/32", "via", r.gw.String(), "dev", r.dev); err != nil {
			return err
		}
	}
	if h.Firewall != nil {
		ruleset := h.Firewall.nftRuleset()
		// nft runs on this thread's namespace: a child forked from a
		// thread inside the namespace starts there.
		if err := inNetns(lh.nsfd, func() error { return runCmd(ctx, ruleset, "nft", "-f", "-") }); err != nil {
			return fmt.Errorf("firewall: %w", err)
		}
	}
	return nil
}

func (l *Lab) info() Info {
	start, _, _ := procStart(os.Getpid())
	inf := Info{ID: l.id, PID: os.Getpid(), Start: start, Owner: ownerCommand(), Name: l.topo.Name, Created: time.Now().UTC()}
	for _, n := range l.order {
		h := l.hosts[n]
		inf.Hosts = append(inf.Hosts, HostInfo{Name: n, Netns: h.netns, Addrs: h.addrs})
	}
	for _, lk := range l.topo.Links {
		ab, ba := lk.Shapes()
		inf.Links = append(inf.Links, LinkInfo{A: lk.A, B: lk.B, DelayLine: lk.Delayed(), AtoB: ab.String(), BtoA: ba.String()})
	}
	return inf
}

// writeState records the lab in stateDir before anything is made, so
// that a crash at any point leaves a lab that List and Clean know.
func (l *Lab) writeState() error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(l.info(), "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(stateDir, "."+l.id+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(stateDir, l.id+".json"))
}

// Close tears the lab down: it stops the delay lines, kills the
// processes still running in its namespaces and deletes them (their
// devices go with them), and removes its state file. Sockets this
// process made in the lab keep their namespace alive, anonymous, until
// they are closed: close them first. Close is idempotent; every call
// returns the first call's result.
func (l *Lab) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.closed = true
		lines := l.sys.lines
		l.mu.Unlock()
		for _, d := range lines {
			d.close()
		}
		var errs []error
		for _, n := range l.order {
			h := l.hosts[n]
			l.mu.Lock()
			if h.nsfd >= 0 {
				unix.Close(h.nsfd)
				h.nsfd = -1
			}
			l.mu.Unlock()
			if _, err := os.Stat(filepath.Join(netnsDir, h.netns)); err == nil {
				if err := deleteNetns(h.netns); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := os.Remove(filepath.Join(stateDir, l.id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			l.err = fmt.Errorf("lab %s: teardown: %w", l.id, errors.Join(errs...))
		}
	})
	return l.err
}

// Stats returns what each delay line has counted so far, in link order.
func (l *Lab) Stats() []LinkStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LinkStats
	for k, d := range l.sys.lines {
		lk := l.topo.Links[l.sys.links[k]]
		out = append(out, LinkStats{A: lk.A, B: lk.B, AtoB: d.ab.stats(), BtoA: d.ba.stats()})
	}
	return out
}

// Do runs f with the calling goroutine's OS thread in host's network
// namespace: sockets f creates (net.Listen, net.Dial, ...) belong to the
// host, for their whole life, whichever goroutine uses them later. Only
// f's own goroutine is in the namespace: goroutines it starts run in this
// process's namespace, so code that dials from several goroutines needs
// each dial wrapped (Dialer) or runs as a process (Command).
func (l *Lab) Do(host string, f func() error) error {
	h, err := l.host(host)
	if err != nil {
		return err
	}
	// A duplicate, so that Close can close the lab's descriptor while f
	// runs.
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("lab %s: %w", l.id, ErrClosed)
	}
	fd, err := unix.FcntlInt(uintptr(h.nsfd), unix.F_DUPFD_CLOEXEC, 0)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return inNetns(fd, f)
}

// Command returns a command that runs name in host's namespace, through
// "ip netns exec" (which also gives it a /sys of that namespace). The
// process gets SIGKILL if this process's thread that started it dies
// (Pdeathsig), and Close kills whatever is left in the namespace. An
// unknown host makes Start fail.
func (l *Lab) Command(host, name string, arg ...string) *exec.Cmd {
	return l.CommandContext(context.Background(), host, name, arg...)
}

// CommandContext is Command with a context that kills the process, as
// exec.CommandContext.
func (l *Lab) CommandContext(ctx context.Context, host, name string, arg ...string) *exec.Cmd {
	h, err := l.host(host)
	ns := ""
	if h != nil {
		ns = h.netns
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, arg...)...)
	if err != nil {
		cmd.Err = err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// WaitListening waits until a TCP socket listens on port in host, by
// reading the namespace's socket table (connecting would be a client to
// servers such as iperf3). It returns ctx's error if ctx ends first.
func (l *Lab) WaitListening(ctx context.Context, host string, port int) error {
	for {
		var found bool
		if err := l.Do(host, func() error { found = procnet.TCPListening(port); return nil }); err != nil {
			return err
		}
		if found {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lab %s: nothing listens on %s port %d: %w", l.id, host, port, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors of the lab.
var (
	// ErrUnsupported: the lab needs Linux.
	ErrUnsupported = errors.New("the WAN lab needs Linux (network namespaces, veth, TUN)")
	// ErrUnknownHost: no host of that name in the lab.
	ErrUnknownHost = errors.New("no such host in the lab")
	// ErrClosed: the lab was torn down.
	ErrClosed = errors.New("lab closed")
)

// Prefix starts the name of every namespace the lab creates:
// "vlab-PID-SEQ-HOST", where PID is the owning process and SEQ counts
// the labs it brought up. The owner's PID in the name is what lets any
// later Up, and "vlink-lab down", find and remove the labs of owners
// that died without tearing them down.
const Prefix = "vlab-"

// stateDir holds one JSON file per lab (Info), for List and for
// "vlink-lab exec" to find hosts by name. /run is a tmpfs: like the
// namespaces mounted in /run/netns, it does not survive a reboot.
const stateDir = "/run/vlink-lab"

// A Lab is a topology brought up: its namespaces, links, shaping and
// firewalls. Its methods are safe for concurrent use. Close tears it
// down; a lab whose owner dies without Close is removed by the next Up or
// by Clean.
type Lab struct {
	id    string
	topo  Topology
	plan  plan
	hosts map[string]*labHost
	order []string // host names in topology order
	sys   labSys   // what the platform needs (delay lines)

	mu     sync.Mutex
	closed bool
	once   sync.Once
	err    error
}

type labHost struct {
	name  string
	netns string
	addrs []netip.Addr
	nsfd  int // open while the lab is up
}

// ID returns the lab's identifier, "PID-SEQ".
func (l *Lab) ID() string { return l.id }

// Topology returns the topology the lab was brought up from.
func (l *Lab) Topology() Topology { return l.topo }

// Hosts returns the names of the lab's hosts, in topology order.
func (l *Lab) Hosts() []string { return append([]string(nil), l.order...) }

// Addr returns host's address: its address on its first link, which every
// other host can reach. It is the zero Addr for an unknown host or one
// without links.
func (l *Lab) Addr(host string) netip.Addr {
	if h := l.hosts[host]; h != nil && len(h.addrs) > 0 {
		return h.addrs[0]
	}
	return netip.Addr{}
}

// Addrs returns all of host's addresses, one per link, in link order.
func (l *Lab) Addrs(host string) []netip.Addr {
	if h := l.hosts[host]; h != nil {
		return append([]netip.Addr(nil), h.addrs...)
	}
	return nil
}

// Netns returns the name of host's network namespace, for
// "ip netns exec NAME ..." (empty for an unknown host).
func (l *Lab) Netns(host string) string {
	if h := l.hosts[host]; h != nil {
		return h.netns
	}
	return ""
}

func (l *Lab) host(name string) (*labHost, error) {
	h := l.hosts[name]
	if h == nil {
		return nil, fmt.Errorf("lab %s: %w: %q (hosts: %s)", l.id, ErrUnknownHost, name, strings.Join(l.order, ", "))
	}
	return h, nil
}

// LinkStats is what a delay line counted, in each direction. Links that
// are veth pairs have none.
type LinkStats struct {
	A, B       string
	AtoB, BtoA DirStats
}

// DirStats counts what one direction of a delay line did. Packets are
// wire packets: a TCP super-packet counts as the segments it carries.
type DirStats struct {
	Packets  uint64 // read from the sending side
	Bytes    uint64 // IP bytes read
	Lost     uint64 // dropped at random (Loss)
	Overflow uint64 // dropped because the queue was full (Queue)
	Sent     uint64 // written to the receiving side
	// WriteErrors counts packets the receiving TUN device refused.
	WriteErrors uint64
	// Late is the total of how late packets were written after the
	// time they were due (the delay line's own added delay: timer
	// wake-ups, and writes queued behind others); LateMax the worst;
	// MeanLate the mean per write.
	Late, LateMax time.Duration
	// Writes counts TUN writes (super-packets count once).
	Writes uint64
	// LateHist counts writes by lateness: bucket 0 under 1µs, bucket k
	// from 2^(k-1) to 2^k µs, the last one everything beyond.
	LateHist [LateBuckets]uint64
}

// LateBuckets is the size of DirStats.LateHist: the last bucket starts at
// 2^22 µs (4.2 s).
const LateBuckets = 24

// LateQuantile returns an upper bound of the q-quantile (0 < q <= 1) of
// the writes' lateness, to a factor of two: the upper edge of the bucket
// that holds it.
func (s DirStats) LateQuantile(q float64) time.Duration {
	var total uint64
	for _, n := range s.LateHist {
		total += n
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var cum uint64
	for k, n := range s.LateHist {
		cum += n
		if cum >= want {
			return time.Duration(1<<k) * time.Microsecond
		}
	}
	return time.Duration(1<<(LateBuckets-1)) * time.Microsecond
}

// MeanLate is the mean lateness per write.
func (s DirStats) MeanLate() time.Duration {
	if s.Writes == 0 {
		return 0
	}
	return s.Late / time.Duration(s.Writes)
}

// Info describes a lab found on the machine: one of this process's, one
// of another live process, or one whose owner died (stale).
type Info struct {
	ID      string     `json:"id"`
	PID     int        `json:"pid"`
	Start   uint64     `json:"start"` // owner's start time, in clock ticks since boot
	Owner   string     `json:"owner"` // owner's command line
	Name    string     `json:"name"`  // topology name
	Created time.Time  `json:"created"`
	Hosts   []HostInfo `json:"hosts"`
	Links   []LinkInfo `json:"links"`
	// Alive: the owner is running. Not stored; List fills it in.
	Alive bool `json:"-"`
	// Orphan: namespaces without a state file (their owner died while
	// bringing them up, or the file was removed); only ID, PID and the
	// hosts' names and namespaces are known.
	Orphan bool `json:"-"`
}

// HostInfo is a host of a lab.
type HostInfo struct {
	Name  string       `json:"name"`
	Netns string       `json:"netns"`
	Addrs []netip.Addr `json:"addrs"`
}

// LinkInfo is a link of a lab, described for people.
type LinkInfo struct {
	A         string `json:"a"`
	B         string `json:"b"`
	DelayLine bool   `json:"delay_line"`
	AtoB      string `json:"a_to_b"`
	BtoA      string `json:"b_to_a"`
}

// Host returns the named host's entry, or nil.
func (i *Info) Host(name string) *HostInfo {
	for k := range i.Hosts {
		if i.Hosts[k].Name == name {
			return &i.Hosts[k]
		}
	}
	return nil
}

// parseNetnsName splits "vlab-PID-SEQ-HOST" into the lab ID ("PID-SEQ"),
// the PID and the host.
func parseNetnsName(name string) (id string, pid int, host string, ok bool) {
	rest, found := strings.CutPrefix(name, Prefix)
	if !found {
		return "", 0, "", false
	}
	parts := strings.SplitN(rest, "-", 3)
	if len(parts) != 3 || !hostNameRE.MatchString(parts[2]) {
		return "", 0, "", false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 || strconv.Itoa(pid) != parts[0] {
		return "", 0, "", false
	}
	if seq, err := strconv.Atoi(parts[1]); err != nil || seq < 0 || strconv.Itoa(seq) != parts[1] {
		return "", 0, "", false
	}
	return parts[0] + "-" + parts[1], pid, parts[2], true
}

func netnsName(id, host string) string { return Prefix + id + "-" + host }

// ownerCommand is this process's command line, for Info.Owner.
func ownerCommand() string {
	s := strings.Join(os.Args, " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// Listen listens on host, as net.Listen.
func (l *Lab) Listen(host, network, address string) (net.Listener, error) {
	var ln net.Listener
	err := l.Do(host, func() (err error) {
		ln, err = net.Listen(network, address)
		return err
	})
	return ln, err
}

// ListenPacket listens on host, as net.ListenPacket.
func (l *Lab) ListenPacket(host, network, address string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := l.Do(host, func() (err error) {
		pc, err = net.ListenPacket(network, address)
		return err
	})
	return pc, err
}

// DialContext dials from host, as net.Dialer.DialContext.
func (l *Lab) DialContext(ctx context.Context, host, network, address string) (net.Conn, error) {
	return l.Dialer(host).DialContext(ctx, network, address)
}

// Dialer returns a dialer whose connections start from host.
func (l *Lab) Dialer(host string) *Dialer { return &Dialer{lab: l, host: host} }

// A Dialer dials from one host of a lab. Its embedded net.Dialer holds
// the options (Timeout, LocalAddr, KeepAlive, ...); its DialContext
// suits http.Transport and anything that takes a dial function.
type Dialer struct {
	net.Dialer
	lab  *Lab
	host string
}

// DialContext dials from the dialer's host.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := d.lab.Do(d.host, func() (err error) {
		c, err = d.Dialer.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

// Dial dials from the dialer's host.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

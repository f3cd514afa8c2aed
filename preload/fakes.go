package preload

import (
	"container/list"
	"encoding/binary"
	"net/netip"
	"strings"
	"sync"
)

// The fake address ranges: a name only the far side can resolve gets one
// address from each, and a connect to either is mapped back to the name.
//
// 198.18.0.0/15 is reserved for benchmarking (RFC 2544): never routed on
// the Internet and rarely used on a LAN, unlike 100.64.0.0/10, which
// carrier NAT and Tailscale use. It is also what other fake-IP resolvers
// (Clash, sing-box) pick. The IPv6 range is a /96 of a unique local
// prefix whose global ID spells "vlink" (76 6c 69 6e 6b), so the low 32
// bits carry the same index as the IPv4 address.
var (
	FakeIPv4 = netip.MustParsePrefix("198.18.0.0/15")
	FakeIPv6 = netip.MustParsePrefix("fd76:6c69:6e6b::/96")
)

// maxFakes is how many names the table holds at once: every index of the
// IPv4 range but its first and last addresses.
const maxFakes = 1<<(32-15) - 2

// fakeMap assigns fake addresses to names, one table for every process of
// the program (it lives in the agent), and maps them back. When full, the
// least recently used name loses its addresses.
type fakeMap struct {
	mu      sync.Mutex
	byName  map[string]*list.Element // of *fakeEntry
	byIndex map[uint32]*list.Element
	lru     list.List // front: most recently used
	next    uint32    // next never-used index
	max     uint32
}

type fakeEntry struct {
	name  string
	index uint32
}

func newFakeMap(max uint32) *fakeMap {
	if max == 0 || max > maxFakes {
		max = maxFakes
	}
	return &fakeMap{byName: map[string]*list.Element{}, byIndex: map[uint32]*list.Element{}, next: 1, max: max}
}

// lookup returns the index for name, assigning one if it has none. name
// must be normalized (normalizeName).
func (m *fakeMap) lookup(name string) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.byName[name]; ok {
		m.lru.MoveToFront(e)
		return e.Value.(*fakeEntry).index
	}
	var idx uint32
	if m.next <= m.max {
		idx = m.next
		m.next++
	} else {
		// Full: recycle the least recently used name's index.
		e := m.lru.Back()
		old := e.Value.(*fakeEntry)
		m.lru.Remove(e)
		delete(m.byName, old.name)
		delete(m.byIndex, old.index)
		idx = old.index
	}
	e := m.lru.PushFront(&fakeEntry{name: name, index: idx})
	m.byName[name] = e
	m.byIndex[idx] = e
	return idx
}

// nameOf returns the name behind a fake address, if the address is one
// this table handed out.
func (m *fakeMap) nameOf(ip netip.Addr) (string, bool) {
	idx, ok := fakeIndex(ip)
	if !ok {
		return "", false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byIndex[idx]
	if !ok {
		return "", false
	}
	m.lru.MoveToFront(e)
	return e.Value.(*fakeEntry).name, true
}

// fakeIndex returns the index a fake address carries.
func fakeIndex(ip netip.Addr) (uint32, bool) {
	ip = ip.Unmap()
	switch {
	case FakeIPv4.Contains(ip):
		a, b := ip.As4(), FakeIPv4.Addr().As4()
		return binary.BigEndian.Uint32(a[:]) - binary.BigEndian.Uint32(b[:]), true
	case FakeIPv6.Contains(ip):
		a := ip.As16()
		return binary.BigEndian.Uint32(a[12:]), true
	}
	return 0, false
}

// fakeAddrs returns the IPv4 and IPv6 fake addresses of an index.
func fakeAddrs(idx uint32) (v4 [4]byte, v6 [16]byte) {
	b := FakeIPv4.Addr().As4()
	binary.BigEndian.PutUint32(v4[:], binary.BigEndian.Uint32(b[:])+idx)
	v6 = FakeIPv6.Addr().As16()
	binary.BigEndian.PutUint32(v6[12:], idx)
	return v4, v6
}

// normalizeName checks that name is a host name a resolver would look up
// (letters, digits, '-', '_' and '.', labels of 1 to 63 bytes, at most
// 253 bytes without a trailing dot) and returns it in lower case without
// the trailing dot.
func normalizeName(name string) (string, bool) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > maxName {
		return "", false
	}
	label := 0
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if label == 0 {
				return "", false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		case c >= 'A' && c <= 'Z':
		default:
			return "", false
		}
		if label++; label > 63 {
			return "", false
		}
	}
	if label == 0 {
		return "", false
	}
	return strings.ToLower(name), true
}

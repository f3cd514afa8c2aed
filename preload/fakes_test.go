package preload

import (
	"net/netip"
	"testing"
)

func TestFakeMap(t *testing.T) {
	m := newFakeMap(3)
	a := m.lookup("a.far")
	if m.lookup("a.far") != a {
		t.Fatal("the same name got two indexes")
	}
	v4, v6 := fakeAddrs(a)
	for _, ip := range []netip.Addr{netip.AddrFrom4(v4), netip.AddrFrom16(v6), netip.AddrFrom16(netip.AddrFrom4(v4).As16())} {
		if !FakeIPv4.Contains(ip.Unmap()) && !FakeIPv6.Contains(ip) {
			t.Errorf("%v is outside the fake ranges", ip)
		}
		if name, ok := m.nameOf(ip); !ok || name != "a.far" {
			t.Errorf("nameOf(%v) = %q, %v", ip, name, ok)
		}
	}
	if _, ok := m.nameOf(netip.MustParseAddr("198.18.0.200")); ok {
		t.Error("an address never handed out maps to a name")
	}
	if _, ok := m.nameOf(netip.MustParseAddr("10.0.0.1")); ok {
		t.Error("a real address maps to a name")
	}
	b, c := m.lookup("b.far"), m.lookup("c.far")
	m.nameOf(netip.AddrFrom4(v4)) // a.far used last: b.far is the oldest
	d := m.lookup("d.far")
	if d != b {
		t.Errorf("full table: d.far got index %d, want b.far's %d (least recently used)", d, b)
	}
	if _, ok := m.nameOf(netip.AddrFrom4(func() [4]byte { v, _ := fakeAddrs(b); return v }())); !ok {
		t.Error("the recycled index does not map to d.far")
	}
	if name, _ := m.nameOf(netip.AddrFrom4(v4)); name != "a.far" {
		t.Errorf("a.far lost its address: %q", name)
	}
	_ = c
	last, _ := fakeAddrs(maxFakes)
	if !FakeIPv4.Contains(netip.AddrFrom4(last)) || last == [4]byte{198, 19, 255, 255} {
		t.Errorf("the last index gives %v", last)
	}
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{
		"Far.Example.":            "far.example",
		"db-1.corp_x.test":        "db-1.corp_x.test",
		"":                        "",
		".":                       "",
		"a..b":                    "",
		".a":                      "",
		"a b":                     "",
		"a\x00b":                  "",
		"ünicode.test":            "",
		string(make([]byte, 254)): "",
	} {
		got, ok := normalizeName(in)
		if got != want || ok != (want != "") {
			t.Errorf("normalizeName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	long := ""
	for i := 0; i < 64; i++ {
		long += "a"
	}
	if _, ok := normalizeName(long + ".test"); ok {
		t.Error("a 64-byte label is accepted")
	}
}

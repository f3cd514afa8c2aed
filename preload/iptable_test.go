package preload

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// evalIPTable is the shim's evaluation (iptable_eval in
// shim/vlink_preload.c), in Go.
func evalIPTable(t *testing.T, table []byte, ip netip.Addr, port uint16) uint8 {
	ip = ip.Unmap()
	count, def := int(table[0]), table[1]
	off := 2
	for k := 0; k < count; k++ {
		action, fam, bits, nports := table[off], table[off+1], int(table[off+18]), int(table[off+19])
		var p [16]byte
		copy(p[:], table[off+2:off+18])
		off += 20
		match := fam == 0
		switch {
		case fam == 4 && ip.Is4():
			match = netip.PrefixFrom(netip.AddrFrom4([4]byte(p[:4])), bits).Contains(ip)
		case fam == 6 && ip.Is6():
			match = netip.PrefixFrom(netip.AddrFrom16(p), bits).Contains(ip)
		}
		in := nports == 0
		for j := 0; j < nports; j++ {
			lo, hi := binary.BigEndian.Uint16(table[off:]), binary.BigEndian.Uint16(table[off+2:])
			off += 4
			in = in || (lo <= port && port <= hi)
		}
		if match && in {
			return action
		}
	}
	if off != len(table) {
		t.Fatalf("table of %d bytes, read %d", len(table), off)
	}
	return def
}

// The table the shim evaluates gives, for every IP destination, the
// action selector gives.
func TestIPTableMatchesSelector(t *testing.T) {
	rules := []selector.Rule{
		{Host: "db.corp.test", Stack: "zstd", Via: "gw:1"}, // a name: not in the table
		{Host: "10.1.0.0/16", Ports: "22,80-90", Action: selector.Refuse},
		{Host: "10.0.0.0/8", Stack: "lz4", Via: "gw:1"},
		{Host: "[fd00::1]", Ports: "443", Action: selector.Direct},
		{Host: "fd00::/8", Stack: "zstd", Via: "gw:1"},
		{Host: "::ffff:192.168.0.0/112", Action: selector.Refuse},
		{Host: "192.168.1.7", Action: selector.Direct},
		{Ports: "25", Action: selector.Refuse},
	}
	for _, def := range []selector.Rule{{}, {Stack: "zstd", Via: "gw:1"}} {
		cfg, err := vlink.NewConfig(rules, def, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := newRouter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r.table == nil {
			t.Fatal("no table for rules within the shim's limits")
		}
		rnd := rand.New(rand.NewPCG(1, 2))
		ips := []string{"10.1.2.3", "10.2.3.4", "10.255.0.1", "fd00::1", "fd00::2", "fe80::1", "192.168.1.7",
			"192.168.2.1", "192.169.0.1", "::ffff:10.1.0.1", "127.0.0.1", "::1", "8.8.8.8"}
		for i := 0; i < 3000; i++ {
			ip := netip.MustParseAddr(ips[rnd.IntN(len(ips))])
			port := uint16(rnd.IntN(100))
			if rnd.IntN(4) == 0 {
				port = uint16(rnd.IntN(65536))
			}
			want, err := r.sel.Match(net.JoinHostPort(ip.String(), strconv.Itoa(int(port))))
			if err != nil {
				t.Fatal(err)
			}
			if got := evalIPTable(t, r.table, ip, port); got != ipAction(want.Action) {
				t.Fatalf("default %v: %v port %d: table says %d, selector %v", def.Action, ip, port, got, want.Action)
			}
		}
	}
}

func TestIPTableLimits(t *testing.T) {
	var rules []selector.Rule
	for i := 0; i <= maxIPRules; i++ {
		rules = append(rules, selector.Rule{Host: "10.0.0." + strconv.Itoa(i), Action: selector.Refuse})
	}
	cfg, err := vlink.NewConfig(rules, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.table != nil {
		t.Errorf("a table of %d rules, over the shim's %d", len(rules), maxIPRules)
	}
}

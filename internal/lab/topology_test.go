package lab

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

func TestUnits(t *testing.T) {
	rates := []struct {
		in   string
		want Bitrate
		out  string
	}{
		{"100mbit", 100 * Mbit, "100mbit"},
		{"1gbit", Gbit, "1gbit"},
		{"2.5Gbit", 2500 * Mbit, "2.5gbit"},
		{"800kbit", 800 * Kbit, "800kbit"},
		{"1234567000", 1234567 * Kbit, "1234.567mbit"},
		{"10gbit/s", 10 * Gbit, "10gbit"},
		{"0", 0, "0"},
	}
	for _, r := range rates {
		got, err := ParseBitrate(r.in)
		if err != nil || got != r.want || got.String() != r.out {
			t.Errorf("ParseBitrate(%q) = %d (%v), %v; want %d (%s)", r.in, got, got, err, r.want, r.out)
		}
	}
	for _, bad := range []string{"", "fast", "-1mbit", "1mbps", "NaN", "1e30gbit"} {
		if _, err := ParseBitrate(bad); err == nil {
			t.Errorf("ParseBitrate(%q) succeeded", bad)
		}
	}
	if got := (Gbit).BytesPer(50 * time.Millisecond); got != 6_250_000 {
		t.Errorf("1gbit over 50ms = %d bytes, want 6250000", got)
	}
	losses := map[string]Loss{"0.1%": 0.001, "0.001": 0.001, "5%": 0.05, "0": 0, "100%": 1}
	for in, want := range losses {
		got, err := ParseLoss(in)
		if err != nil || got != want {
			t.Errorf("ParseLoss(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := ParseLoss(got.String()); err != nil || back != got {
			t.Errorf("ParseLoss(%q) round trip: %v, %v", got.String(), back, err)
		}
	}
	for _, bad := range []string{"", "-1%", "101%", "1.5", "lots"} {
		if _, err := ParseLoss(bad); err == nil {
			t.Errorf("ParseLoss(%q) succeeded", bad)
		}
	}
	sizes := map[string]Size{"64K": 64 << 10, "6M": 6 << 20, "1G": 1 << 30, "1500": 1500}
	for in, want := range sizes {
		got, err := ParseSize(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1T", "-5", "K"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}

func pairTopo(l Link) Topology {
	l.A, l.B = "a", "b"
	return Topology{Hosts: []Host{{Name: "a"}, {Name: "b"}}, Links: []Link{l}}
}

func TestValidate(t *testing.T) {
	for _, name := range Profiles() {
		p, err := Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("profile %s: %v", name, err)
		}
	}
	bad := []struct {
		name string
		topo Topology
		want string
	}{
		{"no hosts", Topology{}, "no hosts"},
		{"bad host name", Topology{Hosts: []Host{{Name: "Client"}}}, "name"},
		{"long host name", Topology{Hosts: []Host{{Name: "abcdefghijklm"}}}, "name"},
		{"duplicate host", Topology{Hosts: []Host{{Name: "a"}, {Name: "a"}}}, "twice"},
		{"unknown end", Topology{Hosts: []Host{{Name: "a"}}, Links: []Link{{A: "a", B: "z"}}}, "both ends"},
		{"self link", Topology{Hosts: []Host{{Name: "a"}}, Links: []Link{{A: "a", B: "a"}}}, "two different"},
		{"host without link", Topology{Hosts: []Host{{Name: "a"}, {Name: "b"}, {Name: "c"}}, Links: []Link{{A: "a", B: "b"}}}, `host "c" has no link`},
		{"duplicate link", Topology{Hosts: []Host{{Name: "a"}, {Name: "b"}}, Links: []Link{{A: "a", B: "b"}, {A: "b", B: "a"}}}, "already linked"},
		{"loss over 1", pairTopo(Link{Loss: 1.5}), "loss"},
		{"huge delay", pairTopo(Link{RTT: Duration(time.Minute)}), "rtt"},
		{"tiny rate", pairTopo(Link{Rate: 10}), "rate"},
		{"flow rate without rate", pairTopo(Link{FlowRate: Mbit}), "without a rate"},
		{"flow rate above rate", pairTopo(Link{Rate: Mbit, FlowRate: 2 * Mbit}), "above the rate"},
		{"tiny flow rate", pairTopo(Link{Rate: Mbit, FlowRate: 10}), "flow_rate"},
		{"tiny queue", pairTopo(Link{RTT: Duration(time.Millisecond), Queue: 1000}), "queue"},
		{"one direction only", pairTopo(Link{AtoB: &Shape{Delay: Duration(time.Millisecond)}}), "both directions"},
		{"directions and link shape", pairTopo(Link{RTT: Duration(time.Millisecond), AtoB: &Shape{}, BtoA: &Shape{}}), "replace"},
		{"bad port", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{Open: []string{"tcp/0"}}}}}, "open"},
		{"bad proto", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{Open: []string{"icmp/1"}}}}}, "open"},
		{"trust non-neighbour", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{Trust: []string{"b"}}}, {Name: "b"}}}, "trust"},
		{"ruleset and open", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{Ruleset: "x", Open: []string{"tcp/1"}}}}}, "ruleset"},
		{"ruleset and nat", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{Ruleset: "x", NAT: "random"}}}}, "ruleset"},
		{"nat without trust", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{NAT: "masquerade"}}}}, "needs trust"},
		{"bad nat", Topology{Hosts: []Host{{Name: "a", Firewall: &Firewall{NAT: "snat", Trust: []string{"b"}}}, {Name: "b"}},
			Links: []Link{{A: "a", B: "b"}}}, "want masquerade or random"},
		{"sysctl outside net", Topology{Hosts: []Host{{Name: "a"}}, Sysctls: map[string]string{"kernel.panic": "1"}}, "net."},
		{"sysctl path escape", Topology{Hosts: []Host{{Name: "a"}}, Sysctls: map[string]string{"net.ipv4..x": "1"}}, "key"},
		{"sysctl newline", Topology{Hosts: []Host{{Name: "a", Sysctls: map[string]string{"net.ipv4.ip_forward": "1\n2"}}}}, "value"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.topo.Validate()
			if !errors.Is(err, ErrTopology) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an ErrTopology mentioning %q", err, tc.want)
			}
		})
	}
}

func TestShapes(t *testing.T) {
	l := Link{Rate: Gbit, RTT: Duration(50 * time.Millisecond), Loss: 0.001}
	ab, ba := l.Shapes()
	if ab != ba {
		t.Fatalf("symmetric link: %+v vs %+v", ab, ba)
	}
	if ab.Delay.D() != 25*time.Millisecond || ab.Buffer != 6_250_000 || ab.Queue != Size(2*3_125_000+1<<20) {
		t.Fatalf("shape %+v: want delay 25ms, buffer one BDP (6250000), queue twice the line's content + 1M", ab)
	}
	if !l.Delayed() {
		t.Fatal("a link with delay is a delay line")
	}
	if (Link{Rate: Gbit}).Delayed() {
		t.Fatal("a rate alone needs no delay line")
	}
	if !(Link{DelayLine: true}).Delayed() {
		t.Fatal("DelayLine forces a delay line")
	}
	asym := Link{AtoB: &Shape{Delay: Duration(10 * time.Millisecond)}, BtoA: &Shape{Loss: 0.5}}
	ab, ba = asym.Shapes()
	if ab.Delay.D() != 10*time.Millisecond || ab.Loss != 0 || ba.Delay != 0 || ba.Loss != 0.5 {
		t.Fatalf("asymmetric shapes %+v %+v", ab, ba)
	}
	if ab.Buffer != 0 {
		t.Fatalf("no rate, no buffer: %+v", ab)
	}
}

func TestPlan(t *testing.T) {
	topo, _ := Profile("firewall") // client - fw - server
	p := makePlan(&topo)
	c, f1 := linkAddrs(0)
	f2, s := linkAddrs(1)
	if !reflect.DeepEqual(p.addrs["fw"], []netip.Addr{f1, f2}) || p.addrs["client"][0] != c || p.addrs["server"][0] != s {
		t.Fatalf("addresses %v", p.addrs)
	}
	want := map[string][]route{
		"client": {{dst: f2, gw: f1, dev: "to-fw"}, {dst: s, gw: f1, dev: "to-fw"}},
		"server": {{dst: c, gw: f2, dev: "to-fw"}, {dst: f1, gw: f2, dev: "to-fw"}},
	}
	if !reflect.DeepEqual(p.routes["client"], want["client"]) || !reflect.DeepEqual(p.routes["server"], want["server"]) || len(p.routes["fw"]) != 0 {
		t.Fatalf("routes %v, want %v", p.routes, want)
	}
	if !p.forwards["fw"] || p.forwards["client"] || p.forwards["server"] {
		t.Fatalf("forwarding hosts %v, want fw only", p.forwards)
	}
	// Disconnected hosts get no routes to each other.
	d := Topology{Hosts: []Host{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}, Links: []Link{{A: "a", B: "b"}, {A: "c", B: "d"}}}
	if p := makePlan(&d); len(p.routes) != 0 {
		t.Fatalf("routes between disconnected pairs: %v", p.routes)
	}
}

func TestFirewallRuleset(t *testing.T) {
	f := &Firewall{Open: []string{"tcp/5201", "udp/53", "tcp/7000-7010"}, Trust: []string{"client"}}
	got := f.nftRuleset()
	for _, want := range []string{
		"type filter hook input priority filter; policy drop;",
		"type filter hook forward priority filter; policy drop;",
		"ct state established,related accept",
		`iifname { "to-client" } accept`,
		"tcp dport { 5201, 7000-7010 } accept",
		"udp dport { 53 } accept",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ruleset lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "masquerade") {
		t.Errorf("a firewall without NAT masquerades:\n%s", got)
	}
	for nat, want := range map[string]string{"masquerade": `oifname != { "to-client" } masquerade` + "\n", "random": `oifname != { "to-client" } masquerade fully-random`} {
		f.NAT = nat
		if got := f.nftRuleset(); !strings.Contains(got, want) || !strings.Contains(got, "type nat hook postrouting priority srcnat;") {
			t.Errorf("NAT %s: ruleset lacks %q:\n%s", nat, want, got)
		}
	}
	if custom := (&Firewall{Ruleset: "table inet x {}\n"}).nftRuleset(); custom != "table inet x {}\n" {
		t.Errorf("custom ruleset replaced: %q", custom)
	}
}

const exampleFile = `
name = "two sites"
seed = 42
[sysctls]
"net.ipv4.tcp_rmem" = "4096 131072 67108864"

[[host]]
name = "client"

[[host]]
name = "server"
firewall = { open = ["tcp/5201"] }

[[link]]
a = "client"
b = "server"
rate = "1gbit"
rtt = "50ms"
jitter = "1ms"
loss = "0.1%"
buffer = "4M"
`

func TestParseTopology(t *testing.T) {
	topo, err := ParseTopology([]byte(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	want := Topology{
		Name:    "two sites",
		Seed:    42,
		Sysctls: map[string]string{"net.ipv4.tcp_rmem": "4096 131072 67108864"},
		Hosts:   []Host{{Name: "client"}, {Name: "server", Firewall: &Firewall{Open: []string{"tcp/5201"}}}},
		Links: []Link{{A: "client", B: "server", Rate: Gbit, RTT: Duration(50 * time.Millisecond),
			Jitter: Duration(time.Millisecond), Loss: 0.001, Buffer: 4 << 20}},
	}
	if !reflect.DeepEqual(topo, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", topo, want)
	}
	for _, bad := range []struct{ doc, want string }{
		{"[[host]]\nname = \"a\"\nnmae = \"b\"\n", "nmae"}, // typo: strict
		{"[[host]]\nname = \"a\"\n[[link]]\na = \"a\"\nb = \"a\"\n", "different"},
		{"[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\nrtt = \"fast\"\n", "duration"},
		{"[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\nloss = 2.0\n", "loss"},
		{"name = ", "line 1"},
		{"[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\nrtt = 50\n", "unit"},
		{"[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\n[link.a_to_b]\ndelay = 5\n[link.b_to_a]\n", "unit"},
	} {
		_, err := ParseTopology([]byte(bad.doc))
		if !errors.Is(err, ErrTopology) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseTopology(%q) = %v, want ErrTopology mentioning %q", bad.doc, err, bad.want)
		}
	}
	// Every profile survives the trip to a file and back.
	for _, name := range Profiles() {
		p, _ := Profile(name)
		b, err := toml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseTopology(b)
		if err != nil || !reflect.DeepEqual(back, p) {
			t.Errorf("profile %s: file\n%s\nparsed as %+v, %v", name, b, back, err)
		}
	}
}

// FuzzParseTopology: no input makes the parser panic, and whatever it
// accepts is a valid topology that survives the trip to a file and back.
func FuzzParseTopology(f *testing.F) {
	f.Add([]byte(exampleFile))
	for _, name := range Profiles() {
		p, _ := Profile(name)
		b, _ := toml.Marshal(p)
		f.Add(b)
	}
	f.Add([]byte("[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n[[link]]\na = \"a\"\nb = \"b\"\n[link.a_to_b]\ndelay = \"5ms\"\n[link.b_to_a]\nloss = 0.5\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := ParseTopology(data)
		if err != nil {
			if !errors.Is(err, ErrTopology) {
				t.Fatalf("error %v does not wrap ErrTopology", err)
			}
			return
		}
		if err := topo.Validate(); err != nil {
			t.Fatalf("accepted an invalid topology: %v", err)
		}
		makePlan(&topo)
		b, err := toml.Marshal(topo)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		back, err := ParseTopology(b)
		if err != nil {
			t.Fatalf("re-parse of\n%s\n: %v", b, err)
		}
		if err := back.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

package selector

import (
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestActionText(t *testing.T) {
	for _, tt := range []struct {
		text string
		want Action
	}{
		{"", Auto},
		{"auto", Auto},
		{"direct", Direct},
		{"stack", Stack},
		{"refuse", Refuse},
	} {
		t.Run(tt.text, func(t *testing.T) {
			var a Action
			if err := a.UnmarshalText([]byte(tt.text)); err != nil || a != tt.want {
				t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", tt.text, a, err, tt.want)
			}
			out, err := a.MarshalText()
			if err != nil {
				t.Fatal(err)
			}
			var back Action
			if err := back.UnmarshalText(out); err != nil || back != a {
				t.Fatalf("round trip %q -> %q -> %v, %v", tt.text, out, back, err)
			}
		})
	}
	for _, bad := range []string{"Direct", "proxy", " stack", "refuse\x00"} {
		t.Run("bad/"+bad, func(t *testing.T) {
			var a Action
			if err := a.UnmarshalText([]byte(bad)); !errors.Is(err, ErrBadRule) {
				t.Fatalf("UnmarshalText(%q) error = %v, want ErrBadRule", bad, err)
			}
		})
	}
	if _, err := Action(9).MarshalText(); !errors.Is(err, ErrBadRule) {
		t.Errorf("MarshalText(Action(9)) error = %v, want ErrBadRule", err)
	}
	if got := Action(9).String(); got != "Action(9)" {
		t.Errorf("Action(9).String() = %q", got)
	}
}

func TestValidate(t *testing.T) {
	good := []Rule{
		{},
		{Host: "*"},
		{Host: "example.com"},
		{Host: "Example.COM."},
		{Host: "*.corp.example", Stack: "ssh:host=gw"},
		{Host: "db-?.lan", Action: Refuse},
		{Host: "*db*", Ports: "5432"},
		{Host: "*.*"},
		{Host: "10.1.2.3"},
		{Host: "10.0.0.0/8"},
		{Host: "fd00::/8"},
		{Host: "[fd00::1]"},
		{Host: "::ffff:10.0.0.0/104"},
		{Ports: "*"},
		{Ports: "443"},
		{Ports: "8000-8100"},
		{Ports: "80, 443,8000-8100 ,1-65535"},
		{Via: "gw.example:7000"},
		{Via: "[fd00::1]:7000", Stack: "zstd"},
		{Action: Stack, Stack: "tcp"},
		{Action: Direct},
	}
	for _, r := range good {
		t.Run("good/"+r.String(), func(t *testing.T) {
			if err := r.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
	bad := []struct {
		rule Rule
		hint string // part of the message a person needs to see
	}{
		{Rule{Action: 7}, "unknown action"},
		{Rule{Host: "10.0.0.0/33"}, "CIDR"},
		{Rule{Host: "10.0.0.1/8"}, "did you mean 10.0.0.0/8"},
		{Rule{Host: "::ffff:10.0.0.0/64"}, "IPv4-mapped"},
		{Rule{Host: "fe80::1%eth0"}, "zone"},
		{Rule{Host: "[example.com]"}, "not an IP address"},
		{Rule{Host: "example.com:443"}, "Ports"},
		{Rule{Host: "10.0.0.*"}, "CIDR prefix"},
		{Rule{Host: ".example.com"}, "*.example.com"},
		{Rule{Host: "a..b"}, "empty label"},
		{Rule{Host: "."}, "empty label"},
		{Rule{Host: "exa mple"}, "not allowed"},
		{Rule{Host: "caf\u00e9.fr"}, "'\u00e9' is not allowed"},
		{Rule{Host: "db[12].lan"}, "not allowed"},
		{Rule{Ports: "0"}, "1-65535"},
		{Rule{Ports: "65536"}, "1-65535"},
		{Rule{Ports: "http"}, "1-65535"},
		{Rule{Ports: "-443"}, "1-65535"},
		{Rule{Ports: "80,"}, "1-65535"},
		{Rule{Ports: "100-90"}, "backwards"},
		{Rule{Ports: "1-2-3"}, "1-65535"},
		{Rule{Action: Refuse, Stack: "tcp"}, "refuse takes no stack"},
		{Rule{Action: Refuse, Via: "gw:1"}, "refuse takes no stack"},
		{Rule{Action: Direct, Stack: "tcp"}, "direct takes no stack"},
		{Rule{Action: Stack}, "needs a stack"},
		{Rule{Via: "gw.example"}, "not host:port"},
		{Rule{Via: ":7000"}, "no host"},
		{Rule{Via: "gw:0"}, "1-65535"},
		{Rule{Via: "gw:vlink"}, "1-65535"},
	}
	for _, tt := range bad {
		t.Run("bad/"+tt.rule.String(), func(t *testing.T) {
			err := tt.rule.Validate()
			if !errors.Is(err, ErrBadRule) {
				t.Fatalf("Validate() = %v, want ErrBadRule", err)
			}
			if !strings.Contains(err.Error(), tt.hint) {
				t.Errorf("Validate() = %q, want it to mention %q", err, tt.hint)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rules []Rule
		def   Rule
		hint  string
	}{
		{"names the rule", []Rule{{Host: "a"}, {Ports: "x"}}, Rule{}, "rule 2:"},
		{"bad default", nil, Rule{Action: Refuse, Stack: "tcp"}, "default rule:"},
		{"default with host", nil, Rule{Host: "*.example"}, "no host or ports"},
		{"default with ports", nil, Rule{Ports: "443"}, "no host or ports"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.rules, tt.def)
			if !errors.Is(err, ErrBadRule) || s != nil {
				t.Fatalf("New() = %v, %v; want nil, ErrBadRule", s, err)
			}
			if !strings.Contains(err.Error(), tt.hint) {
				t.Errorf("New() = %q, want it to mention %q", err, tt.hint)
			}
		})
	}
}

// matchCase is one destination and the rule it must select, by index into
// the rules (-1 for the default).
type matchCase struct {
	addr string
	want int
}

func TestMatch(t *testing.T) {
	for _, group := range []struct {
		name  string
		rules []Rule
		def   Rule
		cases []matchCase
	}{
		{
			name: "globs",
			rules: []Rule{
				{Host: "*.corp.example", Stack: "a"},
				{Host: "db-?.lan", Stack: "b"},
				{Host: "exact.example", Stack: "c"},
				{Host: "web*.prod.*", Stack: "d"},
				{Host: "*a*b*c*", Stack: "e"},
			},
			cases: []matchCase{
				{"x.corp.example:1", 0},
				{"a.b.corp.example:1", 0}, // '*' spans dots
				{"X.CORP.Example:1", 0},   // case-insensitive
				{"x.corp.example.:1", 0},  // trailing dot
				{"corp.example:1", -1},    // the apex is not under it
				{"xcorp.example:1", -1},
				{"x.corp.example.org:1", -1},
				{"db-1.lan:5432", 1},
				{"DB-x.lan.:5432", 1},
				{"db-.lan:5432", -1},
				{"db-12.lan:5432", -1},
				{"exact.example:1", 2},
				{"exact.example.:1", 2},
				{"EXACT.example:1", 2},
				{"exact.example.com:1", -1},
				{"xexact.example:1", -1},
				{"web.prod.eu:1", 3},
				{"web-7.prod.eu.example:1", 3},
				{"web.prod:1", -1},
				{"xaybzc:1", 4},
				{"abab:1", -1},
				{"[::1]:1", -1},         // a glob never matches an IP
				{"10.0.0.1:1", -1},      // nor an IPv4 literal
				{":80", -1},             // empty host: only "*" matches
				{"1.2.3:80", -1},        // not an IP: a name no glob here matches
				{"é.corp.example:1", 0}, // bytes beyond ASCII are compared as bytes
			},
		},
		{
			name: "IPv4",
			rules: []Rule{
				{Host: "10.1.2.3", Action: Refuse},
				{Host: "10.0.0.0/8", Stack: "a"},
				{Host: "192.168.1.0/24", Stack: "b"},
				{Host: "0.0.0.0/0", Stack: "c"},
			},
			cases: []matchCase{
				{"10.1.2.3:80", 0},
				{"10.1.2.4:80", 1},
				{"10.255.255.255:80", 1},
				{"[::ffff:10.1.2.3]:80", 0}, // IPv4-mapped matches as IPv4
				{"[::ffff:10.9.9.9]:80", 1},
				{"192.168.1.77:80", 2},
				{"192.168.2.1:80", 3},
				{"8.8.8.8:53", 3},
				{"[2001:db8::1]:80", -1}, // an IPv4 prefix never matches IPv6
				{"example.com:80", -1},   // nor a name: no resolution
			},
		},
		{
			name: "IPv6",
			rules: []Rule{
				{Host: "[fd00::1]", Action: Refuse},
				{Host: "fd00::/8", Stack: "a"},
				{Host: "2001:db8::/32", Stack: "b"},
				{Host: "::ffff:192.168.0.0/112", Stack: "c"},
				{Host: "::/0", Stack: "d"},
			},
			cases: []matchCase{
				{"[fd00::1]:443", 0},
				{"[FD00:0:0::1]:443", 0},
				{"[fd00::1%eth0]:443", 0}, // zones do not change the network
				{"[fd12:3456::1]:443", 1},
				{"[2001:db8:ffff::1]:443", 2},
				{"192.168.7.7:443", 3}, // mapped prefix applies to IPv4
				{"[::ffff:192.168.7.7]:443", 3},
				{"[2001:db9::1]:443", 4},
				{"10.0.0.1:443", -1}, // an IPv6 prefix never matches IPv4
				{"fd00.example:443", -1},
			},
		},
		{
			// The same difference in both halves of the address must
			// not cancel out (FuzzPrefix found it: an --allow for one
			// host let in another).
			name: "IPv6, both halves",
			rules: []Rule{
				{Host: "0:0:8::8:0", Stack: "a"},
				{Host: "2001:db8::/64", Stack: "b"},
			},
			cases: []matchCase{
				{"[0:0:8::8:0]:1", 0},
				{"[::]:1", -1},
				{"[0:0:8::]:1", -1},
				{"[::8:0]:1", -1},
				{"[2001:db8::1]:1", 1},
				{"[::2001:db8:0:0]:1", -1},
			},
		},
		{
			name: "ports",
			rules: []Rule{
				{Ports: "22", Stack: "a"},
				{Ports: "8000-8100", Stack: "b"},
				{Ports: "80, 443,9000-9001", Stack: "c"},
				{Host: "db.lan", Ports: "5432", Stack: "d"},
			},
			cases: []matchCase{
				{"h:22", 0},
				{"h:ssh", 0}, // service names are looked up like net.Dial does
				{"h:21", -1},
				{"h:23", -1},
				{"h:8000", 1},
				{"h:8050", 1},
				{"h:8100", 1},
				{"h:7999", -1},
				{"h:8101", -1},
				{"h:80", 2},
				{"h:443", 2},
				{"h:9001", 2},
				{"h:9002", -1},
				{"h:00443", 2},
				{"db.lan:5432", 3},
				{"db.lan:5433", -1},
				{"other.lan:5432", -1},
				{"h:0", -1},
				{"h:65535", -1},
			},
		},
		{
			name: "first match wins",
			rules: []Rule{
				{Host: "secret.corp.example", Action: Refuse},
				{Host: "*.corp.example", Ports: "443", Stack: "a"},
				{Host: "*.corp.example", Stack: "b"},
				{Host: "10.0.0.0/16", Action: Direct},
				{Host: "10.0.0.0/8", Via: "gw:7000"},
				{Host: "*", Stack: "catch-all"},
			},
			def: Rule{Action: Refuse}, // unreachable behind "*"
			cases: []matchCase{
				{"secret.corp.example:443", 0},
				{"web.corp.example:443", 1},
				{"web.corp.example:80", 2},
				{"10.0.1.1:80", 3},
				{"10.1.1.1:80", 4},
				{"example.org:80", 5},
			},
		},
		{
			// Exact names are looked up apart from the globs; they must
			// still win or lose by their place in the list.
			name: "exact names keep their place",
			rules: []Rule{
				{Host: "*.a.example", Ports: "443", Stack: "g1"},
				{Host: "x.a.example", Ports: "22", Stack: "e1"},
				{Host: "X.A.Example.", Stack: "e2"},
				{Host: "*.a.example", Stack: "g2"},
				{Host: "x.a.example", Ports: "80", Stack: "e3"},
				{Host: "y.a.example", Ports: "80", Stack: "e4"},
			},
			cases: []matchCase{
				{"x.a.example:443", 0},
				{"x.a.example:22", 1},
				{"x.a.example:80", 2},
				{"x.a.example:8080", 2},
				{"y.a.example:80", 3},
				{"y.a.example:443", 0},
				{"a.example:80", -1},
			},
		},
		{
			name:  "default stack",
			rules: []Rule{{Host: "localhost", Action: Direct}, {Host: "127.0.0.0/8"}},
			def:   Rule{Stack: "tcp|zstd", Via: "gw:7000"},
			cases: []matchCase{
				{"localhost:80", 0},
				{"127.0.0.1:80", 1},
				{"example.org:80", -1},
			},
		},
		{
			name:  "default refuse",
			rules: []Rule{{Host: "*.allowed", Ports: "443"}},
			def:   Rule{Action: Refuse},
			cases: []matchCase{
				{"x.allowed:443", 0},
				{"x.allowed:80", -1},
				{"example.org:443", -1},
			},
		},
	} {
		t.Run(group.name, func(t *testing.T) {
			s, err := New(group.rules, group.def)
			if err != nil {
				t.Fatal(err)
			}
			for _, tt := range group.cases {
				t.Run(tt.addr, func(t *testing.T) {
					got, err := s.Match(tt.addr)
					if err != nil {
						t.Fatalf("Match(%q) error: %v", tt.addr, err)
					}
					want := group.def
					if tt.want >= 0 {
						want = group.rules[tt.want]
					}
					want.Action = want.action()
					if !got.Equal(want) {
						t.Errorf("Match(%q) = {%v}, want {%v}", tt.addr, got, want)
					}
				})
			}
		})
	}
}

func TestMatchResolvesAction(t *testing.T) {
	s, err := New([]Rule{{Host: "a"}, {Host: "b", Stack: "tcp"}, {Host: "c", Via: "gw:1"}, {Host: "d", Action: Refuse}}, Rule{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		addr string
		want Action
	}{
		{"a:1", Direct},
		{"b:1", Stack},
		{"c:1", Stack},
		{"d:1", Refuse},
		{"e:1", Direct},
	} {
		t.Run(tt.addr, func(t *testing.T) {
			if got, err := s.Match(tt.addr); err != nil || got.Action != tt.want {
				t.Fatalf("Match(%q) = %v, %v; want action %v", tt.addr, got, err, tt.want)
			}
		})
	}
}

func TestMatchMalformed(t *testing.T) {
	s, err := New([]Rule{{Host: "*", Stack: "tcp"}}, Rule{})
	if err != nil {
		t.Fatal(err)
	}
	var addrErr *net.AddrError
	for _, tt := range []struct {
		addr     string
		addrType bool // the error also carries net.SplitHostPort's *net.AddrError
	}{
		{"", true},
		{"example.com", true},
		{"::1:80", true},
		{"[::1]", true},
		{"[::1:80", true},
		{"a]:80", true},
		{"example.com:", false},
		{"example.com:65536", false},
		{"example.com:99999999999999999999", false},
		{"example.com:no-such-service-xyz", false},
		{"[fd00::zz]:80", false},
		{"[1:2]:80", false},
	} {
		t.Run(tt.addr, func(t *testing.T) {
			for _, sel := range []*Selector{s, nil} {
				got, err := sel.Match(tt.addr)
				if !errors.Is(err, ErrBadAddress) {
					t.Fatalf("Match(%q) = %v, %v; want ErrBadAddress", tt.addr, got, err)
				}
				if !got.Equal(Rule{}) {
					t.Errorf("Match(%q) returned rule %v with its error", tt.addr, got)
				}
				if tt.addrType && !errors.As(err, &addrErr) {
					t.Errorf("Match(%q) error %v does not carry *net.AddrError", tt.addr, err)
				}
			}
		})
	}
}

func TestNilAndZeroSelector(t *testing.T) {
	empty, err := New(nil, Rule{})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Selector{"nil": nil, "zero": {}, "New(nil, zero)": empty} {
		t.Run(name, func(t *testing.T) {
			for _, addr := range []string{"example.com:80", "10.0.0.1:443", "[::1]:22"} {
				got, err := s.Match(addr)
				if err != nil || !got.Equal(Rule{Action: Direct}) {
					t.Errorf("Match(%q) = %v, %v; want direct", addr, got, err)
				}
			}
			if got := s.Default(); !got.Equal(Rule{Action: Direct}) {
				t.Errorf("Default() = %v", got)
			}
			if got := s.Rules(); len(got) != 0 {
				t.Errorf("Rules() = %v", got)
			}
			if got, want := s.String(), "default: host=* action=direct"; got != want {
				t.Errorf("String() = %q, want %q", got, want)
			}
		})
	}
}

func TestString(t *testing.T) {
	rules := []Rule{
		{Host: "*.corp.example", Ports: "443,8443", Stack: "ssh:host=gw"},
		{Host: "10.0.0.0/8", Action: Refuse},
		{Stack: "tcp | zstd", Via: "[fd00::1]:7000"},
		{Host: "evil", Stack: "a\nrule 9: host=* action=direct"},
	}
	s, err := New(rules, Rule{Action: Refuse})
	if err != nil {
		t.Fatal(err)
	}
	want := `rule 1: host=*.corp.example ports=443,8443 action=stack stack=ssh:host=gw
rule 2: host=10.0.0.0/8 action=refuse
rule 3: host=* action=stack stack="tcp | zstd" via=[fd00::1]:7000
rule 4: host=evil action=stack stack="a\nrule 9: host=REDACTED"
default: host=* action=refuse`
	if got := s.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	// Rules returns a copy: changing it does not change the selector.
	got := s.Rules()
	got[0].Host = "changed"
	if s.Rules()[0].Host != rules[0].Host {
		t.Error("Rules() aliases the selector's rules")
	}
}

// TestNewCopiesRules checks that changing the caller's slice after New
// does not change what the selector matches.
func TestNewCopiesRules(t *testing.T) {
	rules := []Rule{{Host: "a.example", Action: Refuse}}
	s, err := New(rules, Rule{})
	if err != nil {
		t.Fatal(err)
	}
	rules[0].Host, rules[0].Action = "b.example", Direct
	if got, _ := s.Match("a.example:1"); got.Action != Refuse || got.Host != "a.example" {
		t.Errorf("Match after the caller's change = %v", got)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	s := benchSelector(100)
	for _, addr := range []string{
		"host-10.example:443",     // exact name
		"x.y.zone-15.example:443", // suffix glob
		"DB-19-z.LAN.:5432",       // general glob, folded, trailing dot
		"miss.example.org:443",    // every rule, then the default
		"10.19.1.2:80",            // IPv4 prefix
		"[fd00:13::1]:443",        // IPv6 prefix
		"[::ffff:10.19.1.2]:80",   // IPv4-mapped
	} {
		t.Run(addr, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, func() { _, _ = s.Match(addr) }); n != 0 {
				t.Errorf("Match(%q) allocates %v times", addr, n)
			}
		})
	}
}

// config is how a configuration file holds rules.
type config struct {
	Default Rule   `toml:"default" json:"default"`
	Rule    []Rule `toml:"rule" json:"rule"`
}

func TestConfigDecode(t *testing.T) {
	const doc = `
default = { action = "refuse" }

[[rule]]
host = "*.corp.example"
ports = "443,8000-8100"
stack = "ssh:host=gw"

[[rule]]
host = "10.0.0.0/8"
action = "direct"

[[rule]]
host = "fd00::/8"
via = "gw.example:7000"
`
	var cfg config
	dec := toml.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg.Rule, cfg.Default)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		addr  string
		want  Action
		stack string
	}{
		{"git.corp.example:443", Stack, "ssh:host=gw"},
		{"10.2.3.4:22", Direct, ""},
		{"[fd00::5]:80", Stack, ""},
		{"example.org:443", Refuse, ""},
	} {
		got, err := s.Match(tt.addr)
		if err != nil || got.Action != tt.want || got.Stack != tt.stack {
			t.Errorf("Match(%q) = %v, %v; want %v %q", tt.addr, got, err, tt.want, tt.stack)
		}
	}

	// JSON carries the same rules; actions round-trip as text.
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var back config
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Default.Equal(cfg.Default) || len(back.Rule) != len(cfg.Rule) || !back.Rule[1].Equal(cfg.Rule[1]) {
		t.Errorf("JSON round trip: %s -> %+v", js, back)
	}
	if !strings.Contains(string(js), `"action":"direct"`) {
		t.Errorf("JSON does not spell actions as text: %s", js)
	}

	// An unknown action is rejected while decoding, naming the value.
	err = toml.Unmarshal([]byte("[[rule]]\naction = \"proxy\"\n"), &cfg)
	if err == nil || !strings.Contains(err.Error(), `"proxy"`) {
		t.Errorf("decoding action = \"proxy\": %v", err)
	}
}

// TestBestEffortRule: a rule with a Try list races its ways; the list is
// checked, and the rule prints and compares with it.
func TestBestEffortRule(t *testing.T) {
	for _, tt := range []struct {
		name string
		rule Rule
		err  bool
	}{
		{"auto with try", Rule{Host: "db.example", Try: []string{TryDirect, "ssh:host=bastion"}}, false},
		{"explicit", Rule{Action: BestEffort, Try: []string{"socks5:addr=p:1080"}}, false},
		{"no ways", Rule{Action: BestEffort}, true},
		{"a stack too", Rule{Try: []string{TryDirect}, Stack: "zstd"}, true},
		{"a via too", Rule{Try: []string{TryDirect}, Via: "gw:7000"}, true},
		{"given twice", Rule{Try: []string{TryDirect, TryDirect}}, true},
		{"empty way", Rule{Try: []string{""}}, true},
		{"too many", Rule{Try: []string{"a", "b", "c", "d", "e", "f", "g", "h", "i"}}, true},
		{"direct with try", Rule{Action: Direct, Try: []string{TryDirect}}, true},
		{"stack with try", Rule{Action: Stack, Stack: "zstd", Try: []string{TryDirect}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.rule.Validate()
			if (err != nil) != tt.err || (err != nil && !errors.Is(err, ErrBadRule)) {
				t.Fatalf("Validate = %v, want an error: %v", err, tt.err)
			}
		})
	}
	s, err := New([]Rule{{Host: "db.example", Try: []string{TryDirect, "ssh:host=bastion"}}}, Rule{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Match("db.example:5432")
	want := Rule{Host: "db.example", Action: BestEffort, Try: []string{TryDirect, "ssh:host=bastion"}}
	if err != nil || !got.Equal(want) {
		t.Fatalf("Match = %v, %v; want %v", got, err, want)
	}
	if str, want := got.String(), `host=db.example action=best-effort try="direct | ssh:host=bastion"`; str != want {
		t.Fatalf("String = %s, want %s", str, want)
	}
}

// TestRuleHidesSecrets: a rule's errors and text form show no part of a
// proxy URL's user-info, wherever the URL was written.
func TestRuleHidesSecrets(t *testing.T) {
	const url = "socks5://Al1ce:S3cret@proxy.example:1080"
	for _, tc := range []struct {
		name string
		rule Rule
		want string // in the error; "" for a valid rule
	}{
		{"stack", Rule{Host: "x", Stack: url}, ""},
		{"try", Rule{Host: "x", Try: []string{TryDirect, url}}, ""},
		{"try given twice", Rule{Host: "x", Try: []string{url, url}}, "given twice"},
		{"URL as via", Rule{Host: "x", Stack: "zstd", Via: url}, "via"},
		{"URL without port as via", Rule{Host: "x", Stack: "zstd", Via: "socks5://Al1ce:S3cret@proxy.example"}, "via"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rule.Validate()
			shown := tc.rule.String()
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Validate() = %v, want an error saying %q", err, tc.want)
				}
				shown += "\n" + err.Error()
			} else if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(shown, "Al1ce") || strings.Contains(shown, "S3cret") {
				t.Errorf("shows the user-info: %s", shown)
			}
		})
	}
}

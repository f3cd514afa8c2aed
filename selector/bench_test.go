package selector

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/proxy"
)

// benchRules returns n rules in groups of five: an exact name, a suffix
// glob, a general glob, an IPv4 prefix and an IPv6 prefix, group i naming
// host-i.example, *.zone-i.example, db-i-?.lan, 10.i.0.0/16, fd00:i::/32
// (i in hex for IPv6).
func benchRules(n int) []Rule {
	rules := make([]Rule, 0, n)
	for i := 0; len(rules) < n; i++ {
		for _, r := range []Rule{
			{Host: fmt.Sprintf("host-%d.example", i), Stack: "tcp"},
			{Host: fmt.Sprintf("*.zone-%d.example", i), Stack: "tcp"},
			{Host: fmt.Sprintf("db-%d-?.lan", i), Stack: "tcp"},
			{Host: fmt.Sprintf("10.%d.0.0/16", i), Stack: "tcp"},
			{Host: fmt.Sprintf("fd00:%x::/32", i), Stack: "tcp"},
		} {
			if len(rules) < n {
				rules = append(rules, r)
			}
		}
	}
	return rules
}

func benchSelector(n int) *Selector {
	s, err := New(benchRules(n), Rule{Action: Refuse})
	if err != nil {
		panic(err)
	}
	return s
}

// perHost builds the closest golang.org/x/net/proxy equivalent: bypass for
// what the rules name. PerHost has no general globs or ports, so the glob
// rules become exact names there (which never match: it does less work).
func perHost(rules []Rule) *proxy.PerHost {
	p := proxy.NewPerHost(nopDialer{}, nopDialer{})
	for _, r := range rules {
		p.AddFromString(r.Host)
	}
	return p
}

type nopDialer struct{}

func (nopDialer) Dial(network, addr string) (net.Conn, error) { return nil, nil }

// BenchmarkMatch measures Match against two baselines run alongside it:
// split, the destination parsing any selector must do (SplitHostPort and,
// for literals, netip.ParseAddr), and perhost, x/net/proxy.PerHost choosing
// a dialer for the same destination under equivalent rules.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 100} {
		last := n/5 - 1 // the last complete group
		s := benchSelector(n)
		ph := perHost(benchRules(n))
		for _, d := range []struct{ name, addr string }{
			{"name-exact", fmt.Sprintf("host-%d.example:443", last)},
			{"name-suffix", fmt.Sprintf("www.zone-%d.example:443", last)},
			{"name-glob", fmt.Sprintf("db-%d-a.lan:5432", last)},
			{"name-miss", "miss.example.org:443"},
			{"ipv4", fmt.Sprintf("10.%d.1.2:80", last)},
			{"ipv6", fmt.Sprintf("[fd00:%x::1]:443", last)},
			{"ip-miss", "192.0.2.1:80"},
		} {
			prefix := fmt.Sprintf("rules=%d/%s/", n, d.name)
			b.Run(prefix+"split", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					host, _, err := net.SplitHostPort(d.addr)
					if err != nil {
						b.Fatal(err)
					}
					if maybeIP(host) {
						_, _ = netip.ParseAddr(host)
					}
				}
			})
			b.Run(prefix+"perhost", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := ph.Dial("tcp", d.addr); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(prefix+"selector", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := s.Match(d.addr); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkNew measures compiling rules, paid once per configuration load.
func BenchmarkNew(b *testing.B) {
	rules := benchRules(100)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(rules, Rule{}); err != nil {
			b.Fatal(err)
		}
	}
}

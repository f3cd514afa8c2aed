package selector

import (
	"errors"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// FuzzRule feeds arbitrary rule fields and destinations through
// validation, New and Match, which must never panic and must agree.
func FuzzRule(f *testing.F) {
	for _, s := range [][6]string{
		{"", "", "", "", "", "example.com:80"},
		{"*.corp.example", "443,8000-8100", "stack", "ssh:host=gw", "", "x.corp.example:443"},
		{"db-?.lan", "5432", "refuse", "", "", "DB-1.LAN.:5432"},
		{"10.0.0.0/8", "", "direct", "", "", "10.1.2.3:22"},
		{"fd00::/8", "1-65535", "", "", "gw:7000", "[fd00::1%eth0]:443"},
		{"::ffff:10.0.0.0/104", "", "", "tcp", "", "[::ffff:10.9.9.9]:80"},
		{"[fd00::1]", "80, 443", "auto", "", "[::1]:7000", "[fd00::1]:80"},
		{"*a*b*?*", "", "", "", "", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaab:1"},
		{"10.0.0.1/8", "100-90", "proxy", "x", "gw", "::1:80"},
		{"a..b", "0", "", "", ":1", "[::1"},
		{"*", "", "", "", "", "h:http"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	f.Fuzz(func(t *testing.T, host, ports, action, stack, via, addr string) {
		r := Rule{Host: host, Ports: ports, Stack: stack, Via: via}
		if err := r.Action.UnmarshalText([]byte(action)); err != nil {
			if !errors.Is(err, ErrBadRule) {
				t.Fatalf("UnmarshalText error %v does not wrap ErrBadRule", err)
			}
			r.Action = Action(len(action)) // some valid, some not
		}
		if text, err := r.Action.MarshalText(); err == nil {
			var back Action
			if err := back.UnmarshalText(text); err != nil || back != r.Action {
				t.Fatalf("action %v: text %q reads back as %v, %v", r.Action, text, back, err)
			}
		}

		verr := r.Validate()
		if verr != nil && !errors.Is(verr, ErrBadRule) {
			t.Fatalf("Validate() = %v, does not wrap ErrBadRule", verr)
		}
		s, err := New([]Rule{r}, Rule{})
		if (err == nil) != (verr == nil) {
			t.Fatalf("Validate() = %v but New() = %v", verr, err)
		}
		if err != nil {
			return
		}
		if lines := strings.Count(s.String(), "\n") + 1; lines != 2 {
			t.Fatalf("String() has %d lines for one rule:\n%s", lines, s)
		}

		got, err := s.Match(addr)
		_, _, splitErr := net.SplitHostPort(addr)
		if err != nil {
			if !errors.Is(err, ErrBadAddress) {
				t.Fatalf("Match(%q) error %v does not wrap ErrBadAddress", addr, err)
			}
			if !got.Equal(Rule{}) {
				t.Fatalf("Match(%q) returned %v with error %v", addr, got, err)
			}
			if _, nilErr := (*Selector)(nil).Match(addr); nilErr == nil {
				t.Fatalf("Match(%q) fails with %v, but a nil Selector accepts it", addr, err)
			}
			return
		}
		if splitErr != nil {
			t.Fatalf("Match(%q) accepted what net.SplitHostPort rejects: %v", addr, splitErr)
		}
		if nilGot, err := (*Selector)(nil).Match(addr); err != nil || !nilGot.Equal(Rule{Action: Direct}) {
			t.Fatalf("nil Selector: Match(%q) = %v, %v; want direct", addr, nilGot, err)
		}
		want := r
		want.Action = r.action()
		if !got.Equal(want) && !got.Equal(Rule{Action: Direct}) {
			t.Fatalf("Match(%q) = %v, neither the rule nor the default", addr, got)
		}
		if (host == "" || host == "*") && (ports == "" || ports == "*") && !got.Equal(want) {
			t.Fatalf("Match(%q) = %v, but the rule matches everything", addr, got)
		}
	})
}

// matchName reports whether a destination host name (trailing dot
// removed) and port match m. It is the reference for the loop in
// Selector.matchName, which has the same cases inlined.
func (m *matcher) matchName(name string, port uint16) bool {
	if m.ports != nil && !portIn(m.ports, port) {
		return false
	}
	switch m.kind {
	case hostAny:
		return true
	case hostExact:
		return equalFold(name, m.pattern)
	case hostSuffix:
		return len(name) >= len(m.pattern) && equalFold(name[len(name)-len(m.pattern):], m.pattern)
	case hostGlob:
		return globMatch(m.pattern, name)
	}
	return false
}

// FuzzGlob checks globMatch, equalFold and the suffix fast path against a
// regular expression built from the same pattern.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"*.corp.example", "a.b.corp.example"},
		{"db-?.lan", "DB-1.lan"},
		{"*a*b*c*", "xaybzc"},
		{"*a*b*c*", "abab"},
		{"a*", "a"},
		{"*", ""},
		{"?", ""},
		{"**?*x", "yyyyyyyyyyyyyyyyyyyyyyyyyyyyx"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		var c matcher
		if c.compileHost(pattern) != nil || c.kind == hostAny || c.kind == hostPrefix {
			return
		}
		// Names are ASCII in practice; keep the reference simple by
		// comparing byte for byte on ASCII input only.
		for i := 0; i < len(name); i++ {
			if name[i] >= 0x80 {
				return
			}
		}
		expr := regexp.QuoteMeta(strings.ToLower(strings.TrimSuffix(pattern, ".")))
		expr = strings.ReplaceAll(expr, `\*`, `.*`)
		expr = strings.ReplaceAll(expr, `\?`, `.`)
		re := regexp.MustCompile(`(?s)\A` + expr + `\z`)
		want := re.MatchString(strings.ToLower(name))
		if got := c.matchName(name, 1); got != want {
			t.Fatalf("pattern %q (kind %d) on %q: got %v, regexp %v", pattern, c.kind, name, got, want)
		}
	})
}

// FuzzPrefix checks the precomputed masks of ipMatcher against
// netip.Prefix.Contains, after the unmapping both sides get in Match.
func FuzzPrefix(f *testing.F) {
	for _, s := range [][2]string{
		{"10.0.0.0/8", "10.1.2.3"},
		{"10.0.0.0/8", "11.0.0.0"},
		{"0.0.0.0/0", "::1"},
		{"::/0", "1.2.3.4"},
		{"::ffff:10.0.0.0/104", "::ffff:10.9.9.9"},
		{"fd00::/8", "fd12::1"},
		{"2001:db8::/64", "2001:db8::ffff:1"},
		{"2001:db8::1/128", "2001:db8::1"},
		{"1.2.3.4", "1.2.3.4"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, host, addr string) {
		var m matcher
		if m.compileHost(host) != nil || m.kind != hostPrefix {
			return
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		ip = ip.WithZone("").Unmap()
		im := newIPMatcher(&m)
		hi, lo, v6 := ipKey(ip)
		if got, want := im.match(hi, lo, v6, 1), m.prefix.Contains(ip); got != want {
			t.Fatalf("prefix %v (from %q) on %v: got %v, Contains %v", m.prefix, host, ip, got, want)
		}
	})
}

// FuzzMatchOrder checks Match, which splits rules by kind and looks exact
// names up, against the plain reading of the rules: try each in order.
func FuzzMatchOrder(f *testing.F) {
	f.Add("*.a.example", "443", "x.a.example", "", "10.0.0.0/8", "22", "x.a.example:443")
	f.Add("x.a.example", "22", "*", "", "x.a.example", "", "X.A.EXAMPLE.:22")
	f.Add("fd00::/8", "", "*", "80", "::/0", "", "[fd00::1]:80")
	f.Add("db-?", "1-100", "DB-1", "50", "*", "", "db-1:50")
	f.Fuzz(func(t *testing.T, h1, p1, h2, p2, h3, p3, addr string) {
		rules := []Rule{
			{Host: h1, Ports: p1, Stack: "1"},
			{Host: h2, Ports: p2, Stack: "2"},
			{Host: h3, Ports: p3, Stack: "3"},
		}
		s, err := New(rules, Rule{Action: Refuse})
		if err != nil {
			return
		}
		host, portText, err := net.SplitHostPort(addr)
		if err != nil {
			return
		}
		port, err := strconv.ParseUint(portText, 10, 16)
		if err != nil {
			return // service names and bad ports are FuzzRule's business
		}
		ip, err := netip.ParseAddr(host)
		isIP := err == nil
		if !isIP && strings.Contains(host, ":") {
			return
		}
		ip = ip.WithZone("").Unmap()
		want := "default"
		for _, r := range rules {
			_, m, err := compile(r)
			if err != nil {
				t.Fatal(err)
			}
			var ok bool
			switch {
			case m.kind == hostAny:
				ok = m.ports == nil || portIn(m.ports, uint16(port))
			case isIP:
				ok = m.kind == hostPrefix && m.prefix.Contains(ip) && (m.ports == nil || portIn(m.ports, uint16(port)))
			case m.kind != hostPrefix:
				ok = m.matchName(strings.TrimSuffix(host, "."), uint16(port))
			}
			if ok {
				want = r.Stack
				break
			}
		}
		got, err := s.Match(addr)
		if err != nil {
			t.Fatalf("Match(%q): %v", addr, err)
		}
		if got.Action == Refuse {
			got.Stack = "default"
		}
		if got.Stack != want {
			t.Fatalf("Match(%q) chose rule %q, in-order scan chose %q\n%s", addr, got.Stack, want, s)
		}
	})
}

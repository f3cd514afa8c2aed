// Package selector chooses, per destination, what a vlink dial does: go
// direct (plain TCP, no hello), dial through a stack (possibly via a
// forwarding gateway), or refuse.
//
// A [Selector] holds an ordered list of [Rule]s read from configuration;
// the first rule whose host and ports match the destination wins, and a
// default rule covers the rest. Rules are parsed once by [New], so
// [Selector.Match] parses only the destination, and does not allocate
// unless the port is a service name ("https") it must look up.
// Stacks stay in their text form here: the caller parses them against its
// layer registry.
package selector

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// ErrBadAddress is matched by errors about a malformed destination.
var ErrBadAddress = errors.New("bad address")

// A Selector chooses a rule per destination. A nil or zero Selector dials
// everything direct. A Selector is immutable, so it is safe for concurrent
// use.
type Selector struct {
	rules []Rule // as given, Action resolved
	def   Rule   // Action resolved; Auto only in the zero Selector

	// A name never matches an IP rule nor an IP a name rule, so each kind
	// of destination scans only the rules that can match it, in order.
	// Exact names are found by lookup instead; Match keeps whichever
	// candidate comes first in rules.
	names []matcher            // any, suffix and glob rules
	exact map[string][]matcher // lower-case name -> its exact rules
	ips   []ipMatcher          // any and IP rules
}

// New checks and compiles rules and the default rule def, which applies
// when no rule matches. The zero def dials direct; def must not restrict
// Host or Ports. Errors name the offending rule and wrap [ErrBadRule].
func New(rules []Rule, def Rule) (*Selector, error) {
	if len(rules) > math.MaxInt32 {
		return nil, fmt.Errorf("selector: %w: %d rules is too many", ErrBadRule, len(rules))
	}
	s := &Selector{rules: make([]Rule, 0, len(rules))}
	for i, r := range rules {
		r, m, err := compile(r)
		if err != nil {
			return nil, fmt.Errorf("selector: rule %d: %w", i+1, err)
		}
		m.index = int32(i)
		s.rules = append(s.rules, r)
		switch m.kind {
		case hostAny:
			s.names = append(s.names, m)
			s.ips = append(s.ips, newIPMatcher(&m))
		case hostPrefix:
			s.ips = append(s.ips, newIPMatcher(&m))
		case hostExact:
			if s.exact == nil {
				s.exact = make(map[string][]matcher)
			}
			s.exact[m.pattern] = append(s.exact[m.pattern], m)
		default:
			s.names = append(s.names, m)
		}
	}
	if (def.Host != "" && def.Host != "*") || (def.Ports != "" && def.Ports != "*") {
		return nil, fmt.Errorf("selector: default rule: %w: it applies to every destination, so it takes no host or ports", ErrBadRule)
	}
	def, _, err := compile(def)
	if err != nil {
		return nil, fmt.Errorf("selector: default rule: %w", err)
	}
	s.def = def
	return s, nil
}

// directRule is what a nil or zero Selector answers.
var directRule = Rule{Action: Direct}

// Match returns the rule for a dial to address, the host:port given to
// net.Dial (the host a name, an IPv4 address or a bracketed IPv6 address;
// the port a number or a service name). The first matching rule wins, else
// the default. The returned rule is a copy with Action resolved, never
// [Auto]. A malformed address is an error wrapping [ErrBadAddress].
func (s *Selector) Match(address string) (Rule, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return Rule{}, fmt.Errorf("selector: %w %q: %w", ErrBadAddress, address, err)
	}
	port, err := parseDestPort(portText)
	if err != nil {
		return Rule{}, fmt.Errorf("selector: %w %q: %w", ErrBadAddress, address, err)
	}
	var ip netip.Addr
	isIP := false
	if maybeIP(host) {
		if ip, err = netip.ParseAddr(host); err == nil {
			// Zones and IPv4-mapped forms do not change which network the
			// destination is on.
			ip, isIP = ip.WithZone("").Unmap(), true
		} else if strings.IndexByte(host, ':') >= 0 {
			return Rule{}, fmt.Errorf("selector: %w %q: %w", ErrBadAddress, address, err)
		}
	}
	if s == nil {
		return directRule, nil
	}
	best := len(s.rules) // index of the first matching rule so far
	if isIP {
		hi, lo, v6 := ipKey(ip)
		for i := range s.ips {
			if m := &s.ips[i]; m.match(hi, lo, v6, port) {
				best = int(m.index)
				break
			}
		}
	} else {
		if len(host) > 0 && host[len(host)-1] == '.' {
			host = host[:len(host)-1]
		}
		best = s.matchName(host, port)
	}
	if best < len(s.rules) {
		return s.rules[best], nil
	}
	if s.def.Action == Auto {
		return directRule, nil // zero Selector
	}
	return s.def, nil
}

// matchName returns the index of the first rule matching a host name, or
// len(s.rules).
func (s *Selector) matchName(name string, port uint16) int {
	best := len(s.rules)
	if s.exact != nil && len(name) <= maxName {
		var buf [maxName]byte
		for i := 0; i < len(name); i++ {
			buf[i] = lower(name[i])
		}
		// The conversion in a map index does not allocate.
		for i, ms := 0, s.exact[string(buf[:len(name)])]; i < len(ms); i++ {
			if m := &ms[i]; m.ports == nil || portIn(m.ports, port) {
				best = int(m.index)
				break
			}
		}
	}
	for i := range s.names {
		m := &s.names[i]
		if int(m.index) >= best {
			break
		}
		// The cases of matcher.matchName (in the tests), inlined: this loop
		// is the hot path of Match.
		var ok bool
		switch m.kind {
		case hostSuffix:
			ok = len(name) >= len(m.pattern) && equalFold(name[len(name)-len(m.pattern):], m.pattern)
		case hostGlob:
			ok = globMatch(m.pattern, name)
		default: // hostAny; exact names are in s.exact
			ok = true
		}
		if ok && (m.ports == nil || portIn(m.ports, port)) {
			return int(m.index)
		}
	}
	return best
}

// maybeIP reports whether host could be an IP literal, so that names skip
// netip.ParseAddr, whose error would allocate.
func maybeIP(host string) bool {
	if strings.IndexByte(host, ':') >= 0 {
		return true
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return host != ""
}

// parseDestPort parses a destination port as net.Dial does: a decimal
// number, or a service name looked up like net.Dial("tcp", ...) would.
func parseDestPort(s string) (uint16, error) {
	if s == "" {
		return 0, errors.New("missing port")
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			p, err := net.DefaultResolver.LookupPort(context.Background(), "tcp", s)
			if err != nil {
				return 0, err
			}
			return uint16(p), nil
		}
		if n = n*10 + int(c-'0'); n > 65535 {
			return 0, errors.New("port out of range")
		}
	}
	return uint16(n), nil
}

// Rules returns a copy of the rules, in order, with Action resolved.
func (s *Selector) Rules() []Rule {
	if s == nil {
		return nil
	}
	return slices.Clone(s.rules)
}

// Default returns the default rule with Action resolved.
func (s *Selector) Default() Rule {
	if s == nil || s.def.Action == Auto {
		return directRule
	}
	return s.def
}

// String lists the rules one per line, in the order they are tried, then
// the default, for diagnostics:
//
//	rule 1: host=*.corp.example ports=443 action=stack stack=ssh:host=gw
//	default: host=* action=direct
func (s *Selector) String() string {
	var b strings.Builder
	if s != nil {
		for i := range s.rules {
			b.WriteString("rule ")
			b.WriteString(strconv.Itoa(i + 1))
			b.WriteString(": ")
			s.rules[i].format(&b)
			b.WriteByte('\n')
		}
	}
	b.WriteString("default: ")
	def := s.Default()
	def.format(&b)
	return b.String()
}

package nodecert

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vlink-dev/vlink/internal/nodename"
)

// ErrInvalidRule is matched by NewRules' errors.
var ErrInvalidRule = errors.New("invalid rule")

// A Rule allows connections from the nodes From matches to the nodes To
// matches, on the ports Ports of the latter. Its fields are as a TOML
// table spells them:
//
//	[[allow]]
//	from = "group:ops"
//	to = "db"
//	ports = "5432"
type Rule struct {
	// From and To match nodes by their certificates: a node's name, or
	// "group:NAME" for the nodes in that group, or "*" for every node.
	From string `toml:"from"`
	To   string `toml:"to"`
	// Ports are the destination ports allowed: one port ("5432"), an
	// inclusive range ("1000-2000"), or "*" for all. Required, so that a
	// rule left without ports opens nothing by mistake.
	Ports string `toml:"ports"`
}

// Rules say who may reach whom. With no rules everything is allowed, as
// in a network before rules; with at least one, a connection is allowed
// only if a rule allows it (default deny). Rules are immutable, so safe
// for concurrent use.
type Rules struct {
	rules []rule
}

type rule struct {
	from, to matcher
	lo, hi   uint16 // ports, inclusive
}

// A matcher matches certificates: every one, those of a group, or the
// one of a name.
type matcher struct {
	any   bool
	group string
	name  string
}

func (m matcher) match(c *Certificate) bool {
	switch {
	case m.any:
		return true
	case m.group != "":
		return c.InGroup(m.group)
	}
	return c.name == m.name
}

const groupPrefix = "group:"

// NewRules checks rules and compiles them; an error names the rule (from
// 1) and matches ErrInvalidRule.
func NewRules(rules []Rule) (*Rules, error) {
	rs := &Rules{rules: make([]rule, 0, len(rules))}
	for i, r := range rules {
		c, err := compile(r)
		if err != nil {
			return nil, fmt.Errorf("nodecert: rule %d (from %q to %q ports %q): %w: %s", i+1, r.From, r.To, r.Ports, ErrInvalidRule, err)
		}
		rs.rules = append(rs.rules, c)
	}
	return rs, nil
}

// compile returns a rule's compiled form, or an error for people (not
// wrapped: NewRules wraps it).
func compile(r Rule) (rule, error) {
	var c rule
	var err error
	if c.from, err = parseMatcher(r.From, "from"); err != nil {
		return c, err
	}
	if c.to, err = parseMatcher(r.To, "to"); err != nil {
		return c, err
	}
	c.lo, c.hi, err = parsePorts(r.Ports)
	return c, err
}

func parseMatcher(s, field string) (matcher, error) {
	if s == "*" {
		return matcher{any: true}, nil
	}
	if g, ok := strings.CutPrefix(s, groupPrefix); ok {
		if !ValidGroup(g) {
			return matcher{}, fmt.Errorf("%s: %q is not a valid group name", field, g)
		}
		return matcher{group: g}, nil
	}
	if !nodename.Valid(s) {
		return matcher{}, fmt.Errorf("%s: want a node name, \"group:NAME\" or \"*\"", field)
	}
	return matcher{name: s}, nil
}

func parsePorts(s string) (lo, hi uint16, err error) {
	if s == "*" {
		return 0, 1<<16 - 1, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = parsePort(a); err != nil {
		return 0, 0, err
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = parsePort(b); err != nil {
		return 0, 0, err
	}
	if lo > hi {
		return 0, 0, fmt.Errorf("ports: the range %d-%d is empty", lo, hi)
	}
	return lo, hi, nil
}

// parsePort reads a port of 1 to 65535, in decimal digits only (no sign,
// no space), so that each port has one spelling in a rule.
func parsePort(s string) (uint16, error) {
	if s == "" || s[0] < '1' || s[0] > '9' || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("ports: want a port, a range LOW-HIGH or \"*\", got %q", s)
	}
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("ports: %q is not a port (1 to 65535)", s)
	}
	return uint16(p), nil
}

// Allowed reports whether the node holding from may reach port of the
// node holding to. The certificates are taken as already checked (Trust).
func (r *Rules) Allowed(from, to *Certificate, port uint16) bool {
	if r == nil || len(r.rules) == 0 {
		return true
	}
	if from == nil || to == nil {
		return false
	}
	for _, c := range r.rules {
		if port >= c.lo && port <= c.hi && c.from.match(from) && c.to.match(to) {
			return true
		}
	}
	return false
}

// Len is how many rules there are; with none, everything is allowed.
func (r *Rules) Len() int {
	if r == nil {
		return 0
	}
	return len(r.rules)
}

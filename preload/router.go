package preload

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// A router decides, per destination, what a connect does: the user's
// rules (a vlink.Config) read the way vlink.Dial reads them.
type router struct {
	cfg    *vlink.Config
	sel    *selector.Selector // nil: everything direct
	rules  []selector.Rule
	def    selector.Rule
	stacks map[string]vlink.Stack

	// probes[i] matches a name against rules[i]'s host only, ignoring its
	// ports: for names resolved before their port is known.
	probes []*selector.Selector
	// ipsDirect: no rule sends a literal IP destination anywhere but
	// direct, so the shim connects to real addresses without asking.
	ipsDirect bool
	// table is the rules for IP destinations as the shim evaluates them
	// (iptable.go); nil if they do not fit its limits.
	table []byte
}

func newRouter(cfg *vlink.Config) (*router, error) {
	if cfg == nil {
		cfg = &vlink.Config{}
	}
	r := &router{cfg: cfg, sel: cfg.Selector(), stacks: map[string]vlink.Stack{}}
	r.rules = r.sel.Rules()
	r.def = r.sel.Default()
	r.ipsDirect = r.def.Action == selector.Direct
	for _, rule := range append(append([]selector.Rule(nil), r.rules...), r.def) {
		if rule.Action == selector.Stack {
			if _, ok := r.stacks[rule.Stack]; !ok {
				s, err := vlink.Parse(rule.Stack)
				if err != nil {
					return nil, fmt.Errorf("preload: rule %s: %w", rule, err)
				}
				r.stacks[rule.Stack] = s
			}
		}
	}
	for _, rule := range r.rules {
		if rule.Action != selector.Direct && matchesIPs(rule.Host) {
			r.ipsDirect = false
		}
		p, err := selector.New([]selector.Rule{{Host: rule.Host, Action: selector.Refuse}}, selector.Rule{})
		if err != nil {
			return nil, fmt.Errorf("preload: rule %s: %w", rule, err)
		}
		r.probes = append(r.probes, p)
	}
	if t, ok := r.ipTable(); ok {
		r.table = t
	}
	return r, nil
}

// matchesIPs reports whether a rule's host can match a literal IP
// destination: any host, an IP address or a CIDR prefix.
func matchesIPs(host string) bool {
	if host == "" || host == "*" {
		return true
	}
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(h)
	return err == nil
}

// A decision is what to do for one destination.
type decision struct {
	rule  selector.Rule // Action resolved: Direct, Stack or Refuse
	stack vlink.Stack   // for Stack
}

// decide returns the route for target, host:port as vlink.Dial takes it.
// A node of a vlink network (NODE.vlink.alt:PORT) is reached through the
// network whatever the rules say, with the matching rule's stack if it
// has one: a rule cannot send it direct (to the DNS) or via a gateway.
func (r *router) decide(target string) (decision, error) {
	rule, err := r.sel.Match(target)
	if err != nil {
		return decision{}, err
	}
	if _, _, node := vlink.SplitNodeAddr(target); node && rule.Action != selector.Refuse {
		stack := rule.Stack
		if rule.Action != selector.Stack {
			stack = ""
		}
		rule = selector.Rule{Action: selector.Stack, Stack: stack}
	}
	d := decision{rule: rule}
	if rule.Action == selector.Stack {
		d.stack = r.stacks[rule.Stack]
	}
	return d, nil
}

// nameRouted reports whether the far side must resolve name: whether a
// connect to it on port (0: any port, not known yet) may be routed
// anywhere but direct. A refused name counts as routed too: it gets a fake
// address and the connect is refused, so no DNS query leaks for it.
func (r *router) nameRouted(name string, port uint16) bool {
	if _, _, node := vlink.SplitNodeAddr(net.JoinHostPort(name, "1")); node {
		return true // a node's name is never a DNS name
	}
	if port != 0 {
		d, err := r.decide(net.JoinHostPort(name, strconv.Itoa(int(port))))
		return err != nil || d.rule.Action != selector.Direct
	}
	for i, rule := range r.rules {
		m, err := r.probes[i].Match(net.JoinHostPort(name, "1"))
		if err != nil {
			return true
		}
		if m.Action != selector.Refuse {
			continue // the rule's host does not match the name
		}
		if rule.Action != selector.Direct {
			return true
		}
		if rule.Ports == "" || rule.Ports == "*" {
			return false // every port of the name goes direct from here on
		}
	}
	return r.def.Action != selector.Direct
}

package preload

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vlink-dev/vlink/selector"
)

// The IP table is the part of the rules that can match a literal IP
// destination, sent to the shim after the welcome so that it decides by
// itself a connect to a real address the rules send direct (or refuse):
// no round trip to the agent, on the first connect to a destination as on
// the later ones. Destinations the table routes through a stack are
// still asked about.
//
//	table = count u8 | default u8 | rule*count
//	rule  = action u8 | family u8 | ip [16] | bits u8 | nports u8 | (lo u16 | hi u16)*nports
//
// family 0 matches any address (then ip and bits are zero), 4 or 6 a
// prefix of that family. nports 0 is any port. The shim's limits:
const (
	maxIPRules = 32
	maxIPPorts = 16
)

// Table actions.
const (
	ipDirect = 1
	ipRefuse = 2
	ipAsk    = 3
)

func ipAction(a selector.Action) uint8 {
	switch a {
	case selector.Direct:
		return ipDirect
	case selector.Refuse:
		return ipRefuse
	}
	return ipAsk
}

// ipTable encodes the rules' IP part, the way selector matches literal
// IP destinations (IPv4-mapped destinations and prefixes as IPv4, zones
// ignored). It returns false if the table would not fit the shim's limits
// or a rule is not understood; the shim then asks about every address
// (and caches the verdicts).
func (r *router) ipTable() ([]byte, bool) {
	body := []byte{0, ipAction(r.def.Action)}
	n := 0
	for _, rule := range r.rules {
		fam, prefix, ok := ruleIPs(rule.Host)
		if !ok {
			return nil, false
		}
		if fam < 0 {
			continue // a name pattern: never matches an IP destination
		}
		ports, ok := rulePorts(rule.Ports)
		if !ok || len(ports) > maxIPPorts {
			return nil, false
		}
		if n++; n > maxIPRules {
			return nil, false
		}
		var ip [16]byte
		bits := 0
		if fam == 4 {
			v4 := prefix.Addr().As4()
			copy(ip[:], v4[:])
			bits = prefix.Bits()
		} else if fam == 6 {
			ip = prefix.Addr().As16()
			bits = prefix.Bits()
		}
		body = append(body, ipAction(rule.Action), byte(fam))
		body = append(body, ip[:]...)
		body = append(body, byte(bits), byte(len(ports)))
		for _, p := range ports {
			body = binary.BigEndian.AppendUint16(body, p[0])
			body = binary.BigEndian.AppendUint16(body, p[1])
		}
	}
	if len(body) > maxBody {
		return nil, false
	}
	body[0] = byte(n)
	return body, true
}

// ruleIPs returns which literal IP destinations a rule's host matches,
// as selector compiles it: family 0 for any host, 4 or 6 with a prefix,
// -1 for a name pattern.
func ruleIPs(host string) (fam int, p netip.Prefix, ok bool) {
	if host == "" || host == "*" {
		return 0, p, true
	}
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return 0, p, false
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 {
				return 0, p, false
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			return 4, p, true
		}
		return 6, p, true
	}
	lit := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip, err := netip.ParseAddr(lit); err == nil {
		if ip.Zone() != "" {
			return 0, p, false
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return 4, netip.PrefixFrom(ip, 32), true
		}
		return 6, netip.PrefixFrom(ip, 128), true
	}
	if strings.Contains(host, ":") {
		return 0, p, false
	}
	return -1, p, true
}

// rulePorts parses a rule's ports as selector does; nil is any port.
func rulePorts(s string) ([][2]uint16, bool) {
	if s == "" || s == "*" {
		return nil, true
	}
	var out [][2]uint16
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
		if err != nil || a == 0 {
			return nil, false
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 16); err != nil || b < a {
				return nil, false
			}
		}
		out = append(out, [2]uint16{uint16(a), uint16(b)})
	}
	return out, true
}

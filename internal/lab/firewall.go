package lab

import (
	"fmt"
	"sort"
	"strings"
)

// nftRuleset returns the ruleset Firewall f loads in its host's
// namespace (a fresh namespace has no other tables).
func (f *Firewall) nftRuleset() string {
	if f.Ruleset != "" {
		return f.Ruleset
	}
	byProto := map[string][]string{}
	for _, o := range f.Open {
		proto, lo, hi, _ := parsePorts(o) // checked by Validate
		p := fmt.Sprint(lo)
		if hi != lo {
			p = fmt.Sprintf("%d-%d", lo, hi)
		}
		byProto[proto] = append(byProto[proto], p)
	}
	var accept []string
	trusted := ""
	if len(f.Trust) > 0 {
		devs := make([]string, len(f.Trust))
		for i, n := range f.Trust {
			devs[i] = fmt.Sprintf("%q", devName(n))
		}
		trusted = "{ " + strings.Join(devs, ", ") + " }"
		accept = append(accept, fmt.Sprintf("iifname %s accept", trusted))
	}
	protos := make([]string, 0, len(byProto))
	for p := range byProto {
		protos = append(protos, p)
	}
	sort.Strings(protos)
	for _, p := range protos {
		accept = append(accept, fmt.Sprintf("%s dport { %s } accept", p, strings.Join(byProto[p], ", ")))
	}
	var b strings.Builder
	b.WriteString("table inet vlab {\n")
	for _, hook := range []string{"input", "forward"} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority filter; policy drop;\n", hook, hook)
		b.WriteString("\t\tct state established,related accept\n")
		b.WriteString("\t\tct state invalid drop\n")
		if hook == "input" {
			b.WriteString("\t\tiifname \"lo\" accept\n")
		}
		b.WriteString("\t\tmeta l4proto { icmp, ipv6-icmp } accept\n")
		for _, a := range accept {
			fmt.Fprintf(&b, "\t\t%s\n", a)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	if f.NAT != "" {
		how := "masquerade"
		if f.NAT == "random" {
			how = "masquerade fully-random"
		}
		b.WriteString("table ip vlabnat {\n")
		b.WriteString("\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
		fmt.Fprintf(&b, "\t\toifname != %s %s\n", trusted, how)
		b.WriteString("\t}\n}\n")
	}
	return b.String()
}

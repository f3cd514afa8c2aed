package selector

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vlink-dev/vlink/internal/secret"
)

// ErrBadRule is matched by every error about a rule's contents.
var ErrBadRule = errors.New("bad rule")

// A Rule says what a dial does for the destinations it matches. Its zero
// value matches everything and dials direct.
type Rule struct {
	// Host matches the destination host. It is one of:
	//   - "" or "*": any destination;
	//   - a glob over host names ("*.corp.example", "db-?.lan"): '*' matches
	//     any run of characters, dots included, and '?' exactly one.
	//     Matching ignores case and a trailing dot. "*.corp.example" does
	//     not match "corp.example" itself; add a rule for it. A glob never
	//     matches a literal IP destination;
	//   - an IP address ("10.1.2.3", "fd00::1", "[fd00::1]");
	//   - a CIDR prefix ("10.0.0.0/8", "fd00::/8").
	// IP addresses and prefixes match literal IP destinations only: the
	// selector never resolves names. IPv4-mapped IPv6 destinations
	// (::ffff:10.1.2.3) match as the IPv4 address they carry.
	Host string `toml:"host" json:"host"`

	// Ports matches the destination port: "" or "*" any, "443",
	// "8000-8100", or a comma-separated list of those ("80,443,8000-8100").
	Ports string `toml:"ports" json:"ports"`

	// Action is what a matching dial does. The zero value, [Auto], means
	// [Stack] if Stack or Via is set and [Direct] otherwise.
	Action Action `toml:"action" json:"action"`

	// Stack is the text form of the stack to dial through. The selector
	// does not parse it: the caller checks it against its registry.
	Stack string `toml:"stack" json:"stack"`

	// Via is the host:port of a "vlink serve" gateway that forwards to the
	// destination. Empty means the stack reaches the destination itself.
	Via string `toml:"via" json:"via"`

	// Try lists the ways to reach the destination, best first, for
	// [BestEffort]: the text forms of stacks, or TryDirect for plain TCP.
	// The selector does not parse them.
	Try []string `toml:"try" json:"try"`
}

// Equal reports whether r and o are the same rule, field by field.
func (r Rule) Equal(o Rule) bool {
	return r.Host == o.Host && r.Ports == o.Ports && r.Action == o.Action && r.Stack == o.Stack && r.Via == o.Via && slices.Equal(r.Try, o.Try)
}

// TryDirect, in a rule's Try list, is plain TCP.
const TryDirect = "direct"

// MaxTry bounds a rule's Try list.
const MaxTry = 8

// action resolves Auto.
func (r *Rule) action() Action {
	if r.Action != Auto {
		return r.Action
	}
	if len(r.Try) > 0 {
		return BestEffort
	}
	if r.Stack != "" || r.Via != "" {
		return Stack
	}
	return Direct
}

// Validate reports what is wrong with r, as an error wrapping [ErrBadRule],
// or nil.
func (r Rule) Validate() error {
	_, _, err := compile(r)
	return err
}

// String returns r as space-separated key=value pairs, omitting empty
// fields; values that need it are quoted, so the result is one line.
func (r Rule) String() string {
	var b strings.Builder
	r.format(&b)
	return b.String()
}

func (r *Rule) format(b *strings.Builder) {
	host := r.Host
	if host == "" {
		host = "*"
	}
	b.WriteString("host=")
	b.WriteString(quote(host))
	if r.Ports != "" {
		b.WriteString(" ports=")
		b.WriteString(quote(r.Ports))
	}
	b.WriteString(" action=")
	b.WriteString(r.Action.String())
	if r.Stack != "" {
		b.WriteString(" stack=")
		b.WriteString(quote(secret.RedactStack(r.Stack))) // rules are logged
	}
	if r.Via != "" {
		b.WriteString(" via=")
		b.WriteString(quote(secret.RedactStack(r.Via))) // an invalid one may be a proxy URL
	}
	if len(r.Try) > 0 {
		b.WriteString(" try=")
		ways := make([]string, len(r.Try))
		for i, w := range r.Try {
			ways[i] = secret.RedactStack(w)
		}
		b.WriteString(quote(strings.Join(ways, " | ")))
	}
}

// quote quotes s if it would otherwise not read back as one token.
func quote(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// hostKind says how a compiled rule matches the destination host.
type hostKind uint8

const (
	hostAny    hostKind = iota
	hostExact           // name equals pattern
	hostSuffix          // name ends with pattern ("*.corp.example" -> ".corp.example")
	hostGlob            // general glob
	hostPrefix          // literal IP destination within prefix
)

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi uint16 }

// maxName is the longest host name an exact or glob pattern may be: the
// DNS limit, which also bounds the buffer Match folds names into.
const maxName = 253

// A matcher is a rule's host and ports, parsed once so that Match parses
// nothing. It is kept apart from the Rule, and small, so that a scan over
// many rules touches little memory.
type matcher struct {
	kind    hostKind
	index   int32  // of the rule in Selector.rules
	pattern string // lower case, no trailing dot; for hostExact, hostSuffix, hostGlob
	prefix  netip.Prefix
	ports   []portRange // nil: any port
}

// compile checks r and returns it with Action resolved, and its matcher.
func compile(r Rule) (Rule, matcher, error) {
	var m matcher
	if !r.Action.valid() {
		return r, m, fmt.Errorf("%w: unknown action %d", ErrBadRule, uint8(r.Action))
	}
	resolved := r
	resolved.Action = r.action()
	if err := m.compileHost(r.Host); err != nil {
		return r, m, err
	}
	var err error
	if m.ports, err = parsePorts(r.Ports); err != nil {
		return r, m, err
	}
	switch resolved.Action {
	case Direct, Refuse:
		if r.Stack != "" || r.Via != "" || len(r.Try) > 0 {
			return r, m, fmt.Errorf("%w: action %s takes no stack, via or try", ErrBadRule, resolved.Action)
		}
	case Stack:
		if r.Stack == "" && r.Via == "" {
			return r, m, fmt.Errorf("%w: action stack needs a stack or a via", ErrBadRule)
		}
		if len(r.Try) > 0 {
			return r, m, fmt.Errorf("%w: action stack takes no try list (best-effort does)", ErrBadRule)
		}
	case BestEffort:
		if r.Stack != "" || r.Via != "" {
			return r, m, fmt.Errorf("%w: action best-effort takes its stacks from try, not stack or via", ErrBadRule)
		}
		if len(r.Try) == 0 || len(r.Try) > MaxTry {
			return r, m, fmt.Errorf("%w: action best-effort needs 1 to %d ways in try, has %d", ErrBadRule, MaxTry, len(r.Try))
		}
		for i, t := range r.Try {
			if t == "" || slices.Contains(r.Try[:i], t) {
				return r, m, fmt.Errorf("%w: try: %q is empty or given twice", ErrBadRule, secret.RedactStack(t))
			}
		}
	}
	if r.Via != "" {
		if err := checkVia(r.Via); err != nil {
			return r, m, err
		}
	}
	return resolved, m, nil
}

func (m *matcher) compileHost(h string) error {
	if h == "" || h == "*" {
		m.kind = hostAny
		return nil
	}
	bad := func(why string) error { return fmt.Errorf("%w: host %q: %s", ErrBadRule, h, why) }
	if strings.Contains(h, "/") {
		p, err := netip.ParsePrefix(h)
		if err != nil {
			return fmt.Errorf("%w: host %q is not a CIDR prefix: %w", ErrBadRule, h, err)
		}
		if p.Addr().Is4In6() {
			// Destinations are unmapped, so match them as IPv4.
			if p.Bits() < 96 {
				return bad("IPv4-mapped prefix shorter than /96")
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p != p.Masked() {
			return bad("has bits set beyond the prefix length; did you mean " + p.Masked().String() + "?")
		}
		m.kind, m.prefix = hostPrefix, p
		return nil
	}
	lit := h
	if len(lit) > 2 && lit[0] == '[' && lit[len(lit)-1] == ']' {
		lit = lit[1 : len(lit)-1]
	}
	if ip, err := netip.ParseAddr(lit); err == nil {
		if ip.Zone() != "" {
			return bad("IPv6 zones are not matched; drop the %zone")
		}
		ip = ip.Unmap()
		m.kind, m.prefix = hostPrefix, netip.PrefixFrom(ip, ip.BitLen())
		return nil
	} else if lit != h || strings.Contains(h, ":") {
		return fmt.Errorf("%w: host %q is not an IP address (a port belongs in Ports): %w", ErrBadRule, h, err)
	}

	p := strings.ToLower(strings.TrimSuffix(h, "."))
	letters, digits, wild := false, false, 0
	for i := 0; i < len(p); i++ {
		switch ch := p[i]; {
		case ch == '*' || ch == '?':
			wild++
		case ch >= '0' && ch <= '9':
			digits = true
		case ch == '.':
		case ch >= 'a' && ch <= 'z' || ch == '-' || ch == '_':
			letters = true
		default:
			r, _ := utf8.DecodeRuneInString(p[i:])
			return bad(fmt.Sprintf("character %q is not allowed in a host glob (letters, digits, '-', '_', '.', '*', '?')", r))
		}
	}
	if digits && !letters {
		return bad("looks like an IP pattern, but globs match names only; use a CIDR prefix such as 10.0.0.0/8")
	}
	if p == "" || p[0] == '.' || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
		return bad("empty label (write *.example.com to match the names under example.com)")
	}
	if len(p) > maxName {
		return bad(fmt.Sprintf("longer than %d bytes, the longest host name", maxName))
	}
	m.pattern = p
	switch {
	case wild == 0:
		m.kind = hostExact
	case wild == 1 && p[0] == '*':
		m.kind, m.pattern = hostSuffix, p[1:]
	default:
		m.kind = hostGlob
	}
	return nil
}

// parsePorts parses "", "*", "443", "8000-8100" or a comma list of ports
// and ranges.
func parsePorts(s string) ([]portRange, error) {
	if s == "" || s == "*" {
		return nil, nil
	}
	var out []portRange
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseRulePort(s, lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = parseRulePort(s, hi); err != nil {
				return nil, err
			}
			if a > b {
				return nil, fmt.Errorf("%w: ports %q: range %q is backwards", ErrBadRule, s, part)
			}
		}
		out = append(out, portRange{a, b})
	}
	return out, nil
}

func parseRulePort(list, s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%w: ports %q: %q is not a port in 1-65535", ErrBadRule, list, s)
	}
	return uint16(n), nil
}

// checkVia checks that via is a host and a numeric port.
func checkVia(via string) error {
	if strings.Contains(via, "@") || strings.Contains(via, "://") {
		// Quoted, it would show a user-info; so would SplitHostPort's words.
		return fmt.Errorf("%w: via holds an '@' or '://', as a proxy URL does: via takes a VLink gateway's HOST:PORT; a proxy, and its user and password, go in the stack", ErrBadRule)
	}
	host, port, err := net.SplitHostPort(via)
	if err != nil {
		return fmt.Errorf("%w: via %q is not host:port: %w", ErrBadRule, via, err)
	}
	if host == "" {
		return fmt.Errorf("%w: via %q has no host", ErrBadRule, via)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%w: via %q: port %q is not in 1-65535", ErrBadRule, via, port)
	}
	return nil
}

// An ipMatcher is a matcher for literal IP destinations, with its prefix
// as a 128-bit value and mask (IPv4 in its IPv4-mapped form), so that a
// test costs two XORs and two ANDs rather than a netip.Prefix.Contains.
type ipMatcher struct {
	hi, lo   uint64 // the prefix's address, masked
	mhi, mlo uint64 // its mask; zero for hostAny
	v6, any  bool
	index    int32
	ports    []portRange
}

// ipKey splits an unmapped, zoneless address into the form ipMatcher uses.
func ipKey(ip netip.Addr) (hi, lo uint64, v6 bool) {
	a := ip.As16()
	return binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:]), ip.Is6()
}

func newIPMatcher(m *matcher) ipMatcher {
	im := ipMatcher{any: m.kind == hostAny, index: m.index, ports: m.ports}
	if im.any {
		return im
	}
	bits := m.prefix.Bits()
	if m.prefix.Addr().Is4() {
		bits += 96
	}
	im.mhi = ^uint64(0) << (64 - min(bits, 64)) // a shift by 64 gives 0
	im.mlo = ^uint64(0) << (128 - max(bits, 64))
	hi, lo, v6 := ipKey(m.prefix.Addr())
	im.hi, im.lo, im.v6 = hi&im.mhi, lo&im.mlo, v6
	return im
}

// match reports whether the destination, split by ipKey, and port match.
func (m *ipMatcher) match(hi, lo uint64, v6 bool, port uint16) bool {
	// Parenthesized: | and ^ bind alike, left to right, so without them
	// a difference in the high half could cancel one in the low half.
	if !m.any && (v6 != m.v6 || ((hi&m.mhi)^m.hi)|((lo&m.mlo)^m.lo) != 0) {
		return false
	}
	return m.ports == nil || portIn(m.ports, port)
}

func portIn(ranges []portRange, p uint16) bool {
	for _, r := range ranges {
		if r.lo <= p && p <= r.hi {
			return true
		}
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// equalFold reports whether s equals the lower-case ASCII pattern p,
// ignoring ASCII case in s. Host names are ASCII (IDNA), so this is the
// folding DNS does, without strings.EqualFold's Unicode rules.
func equalFold(s, p string) bool {
	if len(s) != len(p) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if lower(s[i]) != p[i] {
			return false
		}
	}
	return true
}

// globMatch reports whether name matches the lower-case pattern, where '*'
// matches any run of bytes and '?' one byte. It backtracks only to the
// latest '*', so it takes O(len(pattern)*len(name)) time at worst and
// never recurses.
func globMatch(pattern, name string) bool {
	p, n := 0, 0
	star, resume := -1, 0
	for n < len(name) {
		if p < len(pattern) {
			switch c := pattern[p]; {
			case c == '*':
				star, resume = p, n
				p++
				continue
			case c == '?' || c == lower(name[n]):
				p++
				n++
				continue
			}
		}
		if star < 0 {
			return false
		}
		// Let the latest '*' swallow one more byte and retry.
		resume++
		p, n = star+1, resume
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

package vlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Families are the address families a host name resolves to.
type Families uint8

// Address families.
const (
	FamilyIPv4 Families = 1 << iota
	FamilyIPv6
)

func (f Families) String() string {
	switch f {
	case FamilyIPv4:
		return "ipv4"
	case FamilyIPv6:
		return "ipv6"
	case FamilyIPv4 | FamilyIPv6:
		return "ipv4+ipv6"
	}
	return fmt.Sprintf("families(%d)", uint8(f))
}

// ErrNoLookup is matched by the error of a LookupHost whose route cannot
// ask anyone: a best-effort route, a node of a vlink network, a
// member's dialer (Dialer.Member).
var ErrNoLookup = errors.New("this route cannot look names up")

// LookupHost reports whether the host of address (host:port; the port
// the caller would connect to, or 0) resolves where a dial to address
// would resolve it, and to which address families. A route through a
// gateway (Via, or route layers) asks the last listener on the way, in
// one round trip through the route's stack, so a name only the far side
// knows is found; it needs a listener whose ListenConfig.Lookup answers
// (vlink serve). Any other route resolves the name here, with
// net.DefaultResolver, as its dial would. A name that does not exist is a
// *net.DNSError with IsNotFound set, as from net.LookupHost.
func (d *Dialer) LookupHost(ctx context.Context, address string) (Families, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return 0, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return familyOf(ip), nil
	}
	if _, _, ok := SplitNodeAddr(address); ok {
		return 0, fmt.Errorf("%w: %s names a node", ErrNoLookup, address)
	}
	if d.Member != nil {
		// The answer would be proven by the pre-shared key alone.
		return 0, fmt.Errorf("%w: a member's dialer does not ask (Dialer.Member)", ErrNoLookup)
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	r, err := d.route(address)
	if err != nil {
		return 0, err
	}
	if r.best {
		return 0, fmt.Errorf("%w: %s has a best-effort route", ErrNoLookup, address)
	}
	vias, _, err := r.vias()
	if err != nil {
		return 0, err
	}
	if r.via == "" && len(vias) == 0 {
		return LookupFamilies(ctx, nil, host)
	}
	if !d.InsecurePlaintext {
		if r, err = r.encrypted(address); err != nil {
			return 0, err
		}
	}
	r.lookup, r.waitAccept = true, true
	c, err := r.dial(ctx, "tcp", address, &d.cache)
	if err != nil {
		var re *RefusedError
		if errors.As(err, &re) && re.Code == CodeNoSuchHost {
			return 0, &net.DNSError{Err: "no such host", Name: host, Server: r.via, IsNotFound: true}
		}
		return 0, err
	}
	c.Close()
	a, ok := c.(*lookupAnswer)
	if !ok {
		return 0, fmt.Errorf("vlink: lookup of %s: the stack returned a %T", address, c)
	}
	return a.family, nil
}

// LookupFamilies resolves host with resolver (nil: net.DefaultResolver)
// and returns its address families: the usual ListenConfig.Lookup of a
// listener that dials the targets it forwards to.
func LookupFamilies(ctx context.Context, resolver *net.Resolver, host string) (Families, error) {
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	ips, err := resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return 0, err
	}
	var f Families
	for _, ip := range ips {
		f |= familyOf(ip)
	}
	if f == 0 {
		return 0, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return f, nil
}

func familyOf(ip netip.Addr) Families {
	if ip.Unmap().Is4() {
		return FamilyIPv4
	}
	return FamilyIPv6
}

// lookupAnswer is what the top hello dialer of a lookup returns: the
// connection, to be closed, and the listener's answer.
type lookupAnswer struct {
	net.Conn
	family Families
}

// lookupProof binds a lookup's answer to the key, the hello and the
// challenge, as the server proof does for a connection's accept.
func lookupProof(key, helloBody, serverNonce []byte, f Families, binding []byte) []byte {
	return proof(key, labelLookup, helloBody, append(append([]byte(nil), serverNonce...), byte(f)), binding)
}

// answerLookup answers a lookup's hello whose target the policy allowed,
// and closes the connection: nothing follows a lookup.
func (l *Listener) answerLookup(raw net.Conn, h *Hello, deadline time.Time) error {
	defer raw.Close()
	if l.cfg.Lookup == nil {
		return sendRefusal(raw, refuse(CodeRejected, "this listener does not look names up"))
	}
	if h.Target == "" {
		return sendRefusal(raw, refuse(CodeMalformed, "a lookup names the target whose host to look up"))
	}
	ctx, cancel := context.WithDeadline(l.ctx, deadline)
	f, err := l.cfg.Lookup(ctx, h)
	cancel()
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		l.log.Debug("vlink: looked up", "remote", h.RemoteAddr.String(), "target", h.Target, "answer", "no such host")
		return sendRefusal(raw, refuse(CodeNoSuchHost, "%s: no such host", h.Target))
	case err != nil:
		return sendRefusal(raw, refuse(CodeUnreachable, "looking up %s: %v", h.Target, err))
	case f == 0 || f&^(FamilyIPv4|FamilyIPv6) != 0:
		return sendRefusal(raw, refuse(CodeRejected, "looking up %s: the answer names no known address family", h.Target))
	}
	m := &message{typ: msgAccept, family: f}
	if h.serverProof != nil {
		m.proof = lookupProof(h.key, h.helloBody, h.nonce, f, h.binding)
	}
	if _, err := raw.Write(m.appendFrame(nil)); err != nil {
		return fmt.Errorf("sending the lookup's answer: %w", err)
	}
	l.log.Debug("vlink: looked up", "remote", h.RemoteAddr.String(), "target", h.Target, "answer", f.String())
	return nil
}

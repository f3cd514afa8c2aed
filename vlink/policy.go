package vlink

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// MinKeySize is the shortest pre-shared key accepted.
const MinKeySize = 16

// PlainMode says whether a listener accepts connections that send no hello.
type PlainMode uint8

const (
	// PlainDefault accepts plain connections unless the policy has a Key:
	// a listener that requires authentication does not let plain clients
	// bypass it.
	PlainDefault PlainMode = iota
	// PlainAllow accepts plain connections even with a Key.
	PlainAllow
	// PlainRefuse closes connections that send no hello.
	PlainRefuse
)

// Range bounds a numeric parameter, inclusive.
type Range struct{ Min, Max int64 }

// Policy decides what a listener accepts from a dialer's hello. The zero
// Policy accepts every registered filter within its schema bounds, no
// authentication, plain connections, and no forwarding.
type Policy struct {
	// Layers are the layer names a dialer may ask the listener to mirror.
	// Nil allows every registered filter and multi-link layer; an empty
	// non-nil slice allows none. With a Key, EncryptionLayer is allowed
	// whatever Layers says.
	Layers []string
	// Limits narrow numeric parameters beyond their schema, keyed
	// "layer.param" (for example "zstd.level": {1, 9}), because the
	// listener runs the mirrored layer too: a compression level costs it
	// CPU.
	Limits map[string]Range
	// MaxLayers bounds how many layers a hello may ask for. Zero means 8.
	MaxLayers int
	// Key, when set, is a pre-shared key every VLink dialer must prove it
	// holds, by answering a fresh challenge (a captured hello cannot be
	// replayed). The listener proves it holds the key in return.
	Key []byte
	// Plain says whether connections without a hello are accepted.
	Plain PlainMode
	// InsecurePlaintext lets dialers beyond loopback use a stack without
	// an encryption layer although the policy has a Key. By default such
	// a hello is refused: bytes that leave the host are encrypted (vlink
	// dialers holding the key add the layer themselves, see
	// Dialer.InsecurePlaintext). UNSAFE: set it only where the network
	// itself is trusted.
	InsecurePlaintext bool
	// Identity is the listener's static X25519 private key
	// (32 bytes, see NewIdentity), nil for none. With it, the
	// listener announces the public half in the accept of every hello
	// whose stack holds the encryption layer, and that layer proves the
	// listener holds the private half (Noise NKpsk0 rather than NNpsk0):
	// dialers can pin the key on first use and notice when it changes
	// (Dialer.PeerKey). The pre-shared key alone authenticates a group;
	// an identity tells one listener of the group from another.
	//
	// A listener with an identity also takes early data: the first
	// bytes of a connection in its first flight (Dialer.DialEarly),
	// except in the first flights dated before its start plus the
	// replay window (ARCHITECTURE §2, "Early data"). Each listener
	// remembers the first flights it took, so that a recorded one
	// cannot bring its data to the target twice; listeners that share
	// an identity do not share that record, and a first flight taken by
	// one could be replayed to another once: give each listener its own
	// identity, or set RefuseEarlyData.
	Identity []byte
	// RefuseEarlyData makes a listener with an identity take no early
	// data: the dialer sends it again after the handshake, a round trip
	// later.
	RefuseEarlyData bool
	// Member, when set, makes the listener a member of a network with an
	// owner: a hello that carries a certificate is checked against
	// Member.Trust, answered with Member.Cert, and proven by both sides'
	// keys in the encryption layer, which its stack must hold below any
	// multi-link layer. Connections other nodes make through the network
	// (Vouched) must then carry one: the key the relay hands out is not
	// taken. Hellos without a certificate are checked as before (Key,
	// Plain). Nil: certificates are refused.
	Member *Member
	// Targets are the forwarding targets a dialer may name, as selector
	// rules (host glob, IP or CIDR, ports); the action of the first match
	// decides (Refuse forbids). Nil forbids all forwarding: never an open
	// proxy by default.
	Targets []selector.Rule
	// Datagrams are the targets a dialer may open a datagram session to
	// (UDP: Hello.Datagram), as Targets are for streams and matched the
	// same way. They are separate, so a listener that forwards streams
	// to a host relays no datagrams to it unless told. Nil forbids all.
	Datagrams []selector.Rule
	// Hops are the nodes (VLink listeners, host:port) a dialer may ask
	// the listener to carry its connection on to, through route layers
	// (fwd), as selector rules matched against the next hop as the hello
	// names it; the action of the first match decides (Refuse forbids).
	// Nil forbids: a listener forwards to no other node by default.
	Hops []selector.Rule
}

// memberRules returns the rules of the policy's Member, nil for none.
func (p *Policy) memberRules() *nodecert.Rules {
	if p.Member == nil {
		return nil
	}
	return p.Member.Rules
}

// Validate reports whether the policy is usable.
func (p *Policy) Validate() error {
	if p.Key != nil && len(p.Key) < MinKeySize {
		return fmt.Errorf("vlink: policy: key is %d bytes, want at least %d", len(p.Key), MinKeySize)
	}
	if p.Identity != nil {
		if _, err := IdentityPublic(p.Identity); err != nil {
			return fmt.Errorf("vlink: policy: %w", err)
		}
	}
	if p.Member != nil {
		if err := p.Member.Validate(); err != nil {
			return fmt.Errorf("vlink: policy: %w", err)
		}
	}
	for _, name := range p.Layers {
		s := lookup(name)
		if s == nil {
			return fmt.Errorf("vlink: policy: %w %q", ErrUnknownLayer, name)
		}
		if !s.Kind.Mirrored() {
			return fmt.Errorf("vlink: policy: %s is a %s; only filters and multi-link layers are mirrored", name, s.Kind)
		}
	}
	for k, r := range p.Limits {
		name, param, ok := strings.Cut(k, ".")
		s := lookup(name)
		if !ok || s == nil {
			return fmt.Errorf("vlink: policy: limit %q names no registered layer parameter", k)
		}
		if _, has := s.Param(param); !has {
			return fmt.Errorf("vlink: policy: limit %q names no registered layer parameter", k)
		}
		if r.Min > r.Max {
			return fmt.Errorf("vlink: policy: limit %q: min %d > max %d", k, r.Min, r.Max)
		}
	}
	if p.MaxLayers < 0 {
		return errors.New("vlink: policy: MaxLayers is negative")
	}
	if _, err := p.targets(); err != nil {
		return err
	}
	if _, err := p.hops(); err != nil {
		return err
	}
	if _, err := p.datagrams(); err != nil {
		return err
	}
	return nil
}

func (p *Policy) datagrams() (*selector.Selector, error) {
	if p.Datagrams == nil {
		return nil, nil
	}
	s, err := selector.New(p.Datagrams, selector.Rule{Action: selector.Refuse})
	if err != nil {
		return nil, fmt.Errorf("vlink: policy: datagrams: %w", err)
	}
	return s, nil
}

func (p *Policy) hops() (*selector.Selector, error) {
	if p.Hops == nil {
		return nil, nil
	}
	s, err := selector.New(p.Hops, selector.Rule{Action: selector.Refuse})
	if err != nil {
		return nil, fmt.Errorf("vlink: policy: hops: %w", err)
	}
	return s, nil
}

// AllowsTarget reports, as a nil error, whether a dialer may name target
// (host:port) for the listener to forward to, as the listener would
// decide from a hello. A node asks it before it takes a connection
// through its network, so a refusal comes back at once, with its reason.
func (p *Policy) AllowsTarget(target string) error {
	s, err := p.targets()
	return allows(s, err, target, "this listener does not forward", "forwarding to %s is not allowed here")
}

// AllowsDatagrams is AllowsTarget for datagram sessions: whether a dialer
// may open one to target (Datagrams).
func (p *Policy) AllowsDatagrams(target string) error {
	s, err := p.datagrams()
	return allows(s, err, target, "this listener relays no datagrams", "relaying datagrams to %s is not allowed here")
}

// allows matches target against s, the targets of one kind (nil: none),
// whose building failed with err.
func allows(s *selector.Selector, err error, target, none, refused string) error {
	if err := checkTarget(target); err != nil {
		return fmt.Errorf("target %q: %w", target, err)
	}
	if err != nil {
		return err
	}
	if s == nil {
		return errors.New(none)
	}
	if r, err := s.Match(target); err != nil || r.Action == selector.Refuse {
		return fmt.Errorf(refused, target)
	}
	return nil
}

func (p *Policy) targets() (*selector.Selector, error) {
	if p.Targets == nil {
		return nil, nil
	}
	s, err := selector.New(p.Targets, selector.Rule{Action: selector.Refuse})
	if err != nil {
		return nil, fmt.Errorf("vlink: policy: targets: %w", err)
	}
	return s, nil
}

func (p *Policy) maxLayers() int {
	if p.MaxLayers == 0 {
		return 8
	}
	return p.MaxLayers
}

func (p *Policy) plainAllowed() bool {
	switch p.Plain {
	case PlainAllow:
		return true
	case PlainRefuse:
		return false
	}
	return p.Key == nil
}

// checkStack parses the stack a hello asks for and checks it against the
// registry and the policy. The result holds the mirrored layers only.
func (p *Policy) checkStack(text string, keyed bool) (Stack, *RefusedError) {
	var s Stack
	if text != "" {
		st := secret.ReadStack(text)
		for i, part := range strings.Split(text, "+") {
			l, err := parseLayer(part, st.Layer(i), false)
			if err != nil {
				return Stack{}, refuse(CodeMalformed, "layer %d: %v", i+1, err)
			}
			s.Layers = append(s.Layers, l)
		}
	}
	if len(s.Layers) > p.maxLayers() {
		return Stack{}, refuse(CodeLayer, "%d layers asked, at most %d allowed", len(s.Layers), p.maxLayers())
	}
	for i, l := range s.Layers {
		spec := lookup(l.Name)
		// With a key, the encryption layer is always allowed: dialers
		// add it by themselves beyond loopback.
		listed := p.Layers == nil || contains(p.Layers, l.Name) || (keyed && l.Name == EncryptionLayer)
		if spec == nil || !spec.Kind.Mirrored() || !listed {
			return Stack{}, refuse(CodeLayer, "layer %d (%s) is not allowed here (allowed: %s)", i+1, l.Name, strings.Join(p.allowedNames(), ", "))
		}
		if spec.Kind == layer.KindMultiLink && i > 0 {
			// Each multi-link layer has a hello of its own, below the
			// nested hello of the layers above it.
			return Stack{}, refuse(CodeMalformed, "layer %d (%s): a multi-link layer can only be first in a hello", i+1, l.Name)
		}
		if rerr := checkVersion(i, l, spec); rerr != nil {
			return Stack{}, rerr
		}
		l = helloLayer(l, false)
		s.Layers[i] = l
		if err := spec.Check(l.Params); err != nil {
			return Stack{}, refuse(CodeParam, "layer %d (%s): %v", i+1, l.Name, err)
		}
		for _, prm := range spec.Params {
			r, limited := p.Limits[l.Name+"."+prm.Name]
			if !limited {
				continue
			}
			v, given := l.Params[prm.Name]
			if !given {
				v = prm.Default
			}
			n, _ := prm.Value(v)
			if n < r.Min || n > r.Max {
				return Stack{}, refuse(CodeParam, "layer %d (%s): %s=%s is outside this listener's [%s, %s]",
					i+1, l.Name, prm.Name, v, prm.Format(r.Min), prm.Format(r.Max))
			}
		}
	}
	return s, nil
}

func (p *Policy) allowedNames() []string {
	if p.Layers != nil {
		return p.Layers
	}
	var names []string
	for _, s := range layer.Specs() {
		if s.Kind.Mirrored() {
			names = append(names, s.Name)
		}
	}
	return names
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

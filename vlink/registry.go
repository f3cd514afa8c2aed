package vlink

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"sort"
	"sync"
)

// Kind says where a layer sits in a stack and what it does.
type Kind uint8

const (
	// KindFactory layers make the byte stream that reaches the next hop.
	// They sit at the bottom of a stack and implement [Factory].
	KindFactory Kind = iota + 1
	// KindFilter layers transform one byte stream into another and are
	// mirrored by the peer. They implement [Filter].
	KindFilter
	// KindMultiLink layers build one stream out of several connections of
	// the layer below, or many streams over one. They are mirrored by the
	// peer.
	KindMultiLink
	// KindRoute layers reach the peer through a node that forwards.
	KindRoute
)

func (k Kind) String() string {
	switch k {
	case KindFactory:
		return "factory"
	case KindFilter:
		return "filter"
	case KindMultiLink:
		return "multi-link"
	case KindRoute:
		return "route"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// mirrored reports whether the peer must rebuild the layer from the hello.
func (k Kind) mirrored() bool { return k == KindFilter || k == KindMultiLink }

// A ContextDialer dials a connection. Every layer reaches the wire only
// through the ContextDialer of the layer below it, as in
// golang.org/x/net/proxy. *Dialer and *net.Dialer implement it.
type ContextDialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// A Factory makes the byte stream to address. A terminal factory (tcp)
// reaches the network itself and is handed a nil forward; any other
// factory reaches its own next hop (a proxy, an SSH server) through forward.
type Factory interface {
	DialContext(ctx context.Context, network, address string, forward ContextDialer) (net.Conn, error)
}

// A ListenFactory is a Factory that can also accept connections. Like
// DialContext, Listen reaches its next hop (the SSH server whose side
// listens, say) through forward; a terminal factory gets a nil forward.
type ListenFactory interface {
	Factory
	Listen(ctx context.Context, network, address string, forward ContextDialer) (net.Listener, error)
}

// A Filter transforms a byte stream; the peer applies the same filter on its
// side. Client wraps the dialing side's connection, Server the accepting
// side's. The returned connection owns c: closing it closes c.
type Filter interface {
	Client(c net.Conn) (net.Conn, error)
	Server(c net.Conn) (net.Conn, error)
}

// A Spec describes a layer for the registry: its name in stack specs, its
// kind, its parameters and how to build it.
type Spec struct {
	// Name is the layer's name in stack specs: lower case letters, digits
	// and '-', starting with a letter.
	Name string
	Kind Kind
	// Summary is one line for listings and --help.
	Summary string
	// Params is the parameter schema. Values outside it are rejected when a
	// stack is parsed, so New only sees checked values.
	Params []Param
	// Terminal marks a factory that reaches the network itself and must be
	// the last layer of a stack.
	Terminal bool
	// New builds the layer. It returns a Factory for KindFactory and a
	// Filter for KindFilter.
	New func(args Args) (any, error)
}

func (s *Spec) param(name string) *Param {
	for i := range s.Params {
		if s.Params[i].Name == name {
			return &s.Params[i]
		}
	}
	return nil
}

var (
	registryMu sync.RWMutex
	registry   = map[string]*Spec{}
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// Register adds a layer to the registry. It is meant to be called from the
// init function of the layer's package. It panics if the spec is invalid or
// the name is taken, as these are programming errors.
func Register(s Spec) {
	if !nameRE.MatchString(s.Name) {
		panic(fmt.Sprintf("vlink: Register: invalid layer name %q", s.Name))
	}
	if s.New == nil {
		panic(fmt.Sprintf("vlink: Register %s: New is nil", s.Name))
	}
	if s.Kind < KindFactory || s.Kind > KindRoute {
		panic(fmt.Sprintf("vlink: Register %s: invalid kind %d", s.Name, s.Kind))
	}
	if s.Terminal && s.Kind != KindFactory {
		panic(fmt.Sprintf("vlink: Register %s: only factories can be terminal", s.Name))
	}
	seen := map[string]bool{}
	for _, p := range s.Params {
		if !nameRE.MatchString(p.Name) || seen[p.Name] {
			panic(fmt.Sprintf("vlink: Register %s: invalid or duplicate parameter %q", s.Name, p.Name))
		}
		seen[p.Name] = true
		if p.Required && p.Default != "" {
			panic(fmt.Sprintf("vlink: Register %s: required parameter %s has a default", s.Name, p.Name))
		}
		if p.Default != "" {
			if err := p.check(p.Default); err != nil {
				panic(fmt.Sprintf("vlink: Register %s: default of %s: %v", s.Name, p.Name, err))
			}
		}
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[s.Name]; dup {
		panic(fmt.Sprintf("vlink: Register: layer %q registered twice", s.Name))
	}
	registry[s.Name] = &s
}

// Lookup returns the registered layer with the given name.
func Lookup(name string) (Spec, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s, ok := registry[name]
	if !ok {
		return Spec{}, false
	}
	return *s, true
}

func lookup(name string) *Spec {
	registryMu.RLock()
	defer registryMu.RUnlock()
	return registry[name]
}

// Specs returns every registered layer, sorted by name.
func Specs() []Spec {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]Spec, 0, len(registry))
	for _, s := range registry {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func layerNames() []string {
	specs := Specs()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return names
}

package layer

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
)

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
	// Encrypted marks a terminal factory whose connections are encrypted
	// and integrity-protected by a reviewed construction (QUIC's TLS 1.3)
	// and are ChannelBinders: the hello's proofs of the key cover the
	// channel, so a keyed stack on it needs no encryption layer.
	Encrypted bool
	// Nodes marks a factory that reaches the nodes of a vlink network
	// (NODE.vlink.alt:PORT) through the network itself: its forward is
	// the dialer's network (vlink.Dialer.Network, a *control.Node), and
	// the connections it returns are vlink.Vouched. Such a factory is
	// terminal, and the only factory of its stack.
	Nodes bool
	// EndMarker declares that the layer's connections end their stream
	// with a marker of their own (an end frame, a fin block, a QUIC
	// stream's FIN), so that a stream that ends without it, cut below
	// the layer, is an error at its reader and never io.EOF. A layer
	// without one (identity, tcp) cannot tell a cut stream from an ended
	// one. The conformance suite (package layertest, run on every
	// registered layer by vlink/layers) holds the layer to what it
	// declares, either way.
	EndMarker bool
	// New builds the layer. It returns a Factory for KindFactory, a Filter
	// for KindFilter, a MultiLink for KindMultiLink and a Route for
	// KindRoute.
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

// Param returns the schema entry of the named parameter.
func (s *Spec) Param(name string) (Param, bool) {
	if p := s.param(name); p != nil {
		return *p, true
	}
	return Param{}, false
}

// Check validates a layer's parameters against the schema: every name
// known, every value within its type and bounds, every required parameter
// given. Its errors wrap ErrBadParam.
func (s *Spec) Check(params map[string]string) error {
	for k, v := range params {
		if err := s.CheckName(k); err != nil {
			return err
		}
		if err := s.param(k).Check(v); err != nil {
			return err
		}
	}
	for i := range s.Params {
		if p := &s.Params[i]; p.Required {
			if _, ok := params[p.Name]; !ok {
				return fmt.Errorf("%w: missing required parameter %s (%s)", ErrBadParam, p.Name, p.Doc)
			}
		}
	}
	return nil
}

// CheckName reports a parameter name the schema lacks; its error, which
// wraps ErrBadParam, names it and the known ones, never a value.
func (s *Spec) CheckName(name string) error {
	if s.param(name) != nil {
		return nil
	}
	known := make([]string, len(s.Params))
	for i := range s.Params {
		known[i] = s.Params[i].Name
	}
	if len(known) == 0 {
		return fmt.Errorf("%w: unknown parameter %q (%s takes none)", ErrBadParam, name, s.Name)
	}
	return fmt.Errorf("%w: unknown parameter %q (known: %s)", ErrBadParam, name, strings.Join(known, ", "))
}

// Build calls New with params, which Check has accepted.
func (s *Spec) Build(params map[string]string) (any, error) {
	return s.New(Args{spec: s, vals: params})
}

var (
	registryMu sync.RWMutex
	registry   = map[string]*Spec{}
	nameRE     = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// ValidName reports whether name can name a layer or a parameter: lower
// case letters, digits and '-', starting with a letter.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Register adds a layer to the registry. It is meant to be called from the
// init function of the layer's package. It panics if the spec is invalid or
// the name is taken, as these are programming errors.
func Register(s Spec) {
	if !ValidName(s.Name) {
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
	if s.Nodes && !s.Terminal {
		panic(fmt.Sprintf("vlink: Register %s: a factory that reaches nodes is terminal", s.Name))
	}
	seen := map[string]bool{}
	for _, p := range s.Params {
		if !ValidName(p.Name) || seen[p.Name] {
			panic(fmt.Sprintf("vlink: Register %s: invalid or duplicate parameter %q", s.Name, p.Name))
		}
		seen[p.Name] = true
		if p.Secret && s.Kind != KindFactory {
			panic(fmt.Sprintf("vlink: Register %s: secret parameter %s: only a factory's parameters stay on this side", s.Name, p.Name))
		}
		if p.Required && p.Default != "" {
			panic(fmt.Sprintf("vlink: Register %s: required parameter %s has a default", s.Name, p.Name))
		}
		if p.Default != "" {
			if err := p.Check(p.Default); err != nil {
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

// Names returns the registered layers' names, sorted.
func Names() []string {
	specs := Specs()
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return names
}

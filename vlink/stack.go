package vlink

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"sort"
	"strings"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// A Stack is an ordered list of layers, from the application side down to
// the wire. Its text form is
//
//	stack = layer *( "+" layer )
//	layer = name [ ":" param *( "," param ) ] | proxy-url
//	param = key [ "=" value ]
//	proxy-url = scheme "://" [ user [ ":" password ] "@" ] host [ ":" port ]
//
// for example "zstd:level=3+tcp:nodelay=false". A parameter without a value
// is a true bool. A proxy URL, as curl takes it (socks5, socks5h, socks4,
// socks4a or http; percent-encoded, so a '+' in a password is %2B), is the
// layer that speaks it: "zstd+socks5h://alice@proxy:1080" is
// "zstd+socks5:addr=proxy:1080,user=alice,resolve=remote". Values may
// hold any byte; '%', '+', ',' and bytes outside printable ASCII are
// written %XX. If the last layer is not a terminal factory, "tcp" is
// implied below it, so "zstd" means "zstd+tcp" and "" means plain "tcp".
// None of the grammar's characters need quoting in a POSIX shell.
type Stack struct {
	Layers []Layer
}

// A Layer is one element of a stack: a registered name and its parameters.
type Layer struct {
	Name   string
	Params map[string]string
}

// Errors matched by stack parsing and validation failures, wrapped in a
// *StackError.
var (
	ErrSyntax       = errors.New("syntax error")
	ErrUnknownLayer = errors.New("unknown layer")
	ErrBadStack     = errors.New("invalid stack")
	// ErrBadParam is matched by errors about a parameter value: unknown,
	// missing, of the wrong type or out of bounds. It is layer.ErrBadParam,
	// which layers wrap too.
	ErrBadParam = layer.ErrBadParam
)

// A StackError reports a stack that does not parse or validate. It names
// the offending layer and its position (1-based, counted from the
// application side).
type StackError struct {
	Stack string // the text form, as given or formatted
	Index int    // 1-based layer position; 0 for the whole stack
	Layer string // the layer's name, if known
	Err   error
}

func (e *StackError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vlink: stack %q", secret.RedactStack(e.Stack))
	if e.Index > 0 {
		fmt.Fprintf(&b, ": layer %d", e.Index)
		if e.Layer != "" {
			fmt.Fprintf(&b, " (%s)", e.Layer)
		}
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *StackError) Unwrap() error { return e.Err }

// Parse parses and validates a stack's text form against the registry.
// Its errors show no value that may be a secret, nor any part of a proxy
// URL's user-info (see secret.StackText for the rule): they name the
// layer and the parameter instead.
func Parse(text string) (Stack, error) {
	var s Stack
	if strings.TrimSpace(text) != text {
		return s, &StackError{Stack: text, Err: fmt.Errorf("%w: leading or trailing space", ErrSyntax)}
	}
	if text != "" {
		st := secret.ReadStack(text)
		for i, part := range strings.Split(text, "+") {
			l, err := parseLayer(part, st.Layer(i), true)
			if err != nil {
				return Stack{}, &StackError{Stack: text, Index: i + 1, Layer: l.Name, Err: err}
			}
			s.Layers = append(s.Layers, l)
		}
	}
	if err := s.validate(text); err != nil {
		return Stack{}, err
	}
	return s, nil
}

// MustParse is like Parse but panics on error. It is meant for stacks
// written in programs and tests.
func MustParse(text string) Stack {
	s, err := Parse(text)
	if err != nil {
		panic(err)
	}
	return s
}

// parseLayer reads one layer's text; lt says what of it an error may
// show. A layer's name is left out of the returned Layer when it may be
// part of a secret, so that the error does not name it. With names, a
// parameter its layer's schema lacks is an error here, the first in the
// text's order (validate's check would name the first in the map's); a
// hello's layers may carry one the listener drops (the version).
func parseLayer(part string, lt secret.LayerText, names bool) (Layer, error) {
	if lt.RestOf > 0 {
		return Layer{}, fmt.Errorf("%w: not a layer this program knows, after a secret of layer %d (a password, say), so perhaps the rest of it, cut short by a raw '+': write a '+' in a value or a URL's password as %%2B (the layer's text is not shown)", ErrSyntax, lt.RestOf)
	}
	if strings.Contains(part, "://") {
		return parseProxyURL(part, lt.URL)
	}
	name, params, hasParams := strings.Cut(part, ":")
	l := Layer{Name: name}
	if name == "" {
		return l, fmt.Errorf("%w: empty layer name", ErrSyntax)
	}
	if !layer.ValidName(name) {
		return l, fmt.Errorf("%w: layer name %q: use lower-case letters, digits and '-'", ErrSyntax, name)
	}
	if !hasParams {
		return l, nil
	}
	if params == "" {
		return l, fmt.Errorf("%w: ':' with no parameters after it", ErrSyntax)
	}
	var spec *layer.Spec
	if names {
		spec = lookup(name)
	}
	l.Params = map[string]string{}
	for j, kv := range strings.Split(params, ",") {
		pt := lt.Param(j)
		if pt.RestOf != "" {
			return l, fmt.Errorf("%w: what follows %s=%s may be the rest of its value, cut short by a raw ',': write a ',' in a value as %%2C", ErrSyntax, pt.RestOf, secret.Redacted)
		}
		k, v, hasValue := strings.Cut(kv, "=")
		if !hasValue {
			v = "true" // a bare key is a true bool
		}
		if !layer.ValidName(k) {
			return l, fmt.Errorf("%w: parameter name %q: use lower-case letters, digits and '-'", ErrSyntax, k)
		}
		if _, dup := l.Params[k]; dup {
			return l, fmt.Errorf("%w: parameter %q given twice", ErrSyntax, k)
		}
		if spec != nil {
			if err := spec.CheckName(k); err != nil {
				return l, err
			}
		}
		uv, err := unescape(v)
		if err != nil {
			if !pt.ShowValue {
				return l, fmt.Errorf("%w: parameter %s: a bad escape in its value: write %%XX with two hex digits (%%25 for a '%%')", ErrSyntax, k)
			}
			return l, fmt.Errorf("%w: parameter %s: %v", ErrSyntax, k, err)
		}
		l.Params[k] = uv
	}
	return l, nil
}

// proxySchemes maps the schemes of proxy URLs onto the layers that
// speak them, with the parameters each scheme implies: curl's meanings,
// socks5h and socks4a resolving names at the proxy. Its keys are
// secret.ProxySchemes.
var proxySchemes = map[string]Layer{
	"socks5":  {Name: "socks5", Params: map[string]string{"resolve": "local"}},
	"socks5h": {Name: "socks5", Params: map[string]string{"resolve": "remote"}},
	"socks4":  {Name: "socks4"},
	"socks4a": {Name: "socks4a"},
	"http":    {Name: "http"},
}

// defaultProxyPort is the port of a SOCKS proxy URL that names none, as
// curl has it. An http URL must name its port: proxies listen on 3128,
// 8080 or 80 as often as not.
const defaultProxyPort = "1080"

// encodeHint says how to write a URL's user-info that does not parse.
const encodeHint = "percent-encode what a user name or password holds of / # ? @ + , % : and spaces (%2F %23 %3F %40 %2B %2C %25 %3A %20)"

// parseProxyURL reads a layer written as a proxy URL, the form curl,
// ALL_PROXY and proxychains users paste: scheme://[user[:password]@]host[:port],
// the scheme one of proxySchemes'; ui says where its user-info ends.
// Errors never show the user-info, nor url.Parse's words, which quote
// it: they show the host when it is known to be one.
func parseProxyURL(text string, ui secret.URLUserInfo) (Layer, error) {
	scheme, rest, _ := strings.Cut(text, "://")
	scheme = strings.ToLower(scheme)
	proto, ok := proxySchemes[scheme]
	if !ok {
		return Layer{}, fmt.Errorf("%w: proxy URL scheme %q: want socks5, socks5h, socks4, socks4a or http", ErrSyntax, scheme)
	}
	l := Layer{Name: proto.Name, Params: map[string]string{}}
	shown := scheme + "://" + secret.Redacted // the URL as errors show it
	switch ui {
	case secret.NoUserInfo:
		shown = text
	case secret.UserInfoHere:
		shown += "@" + rest[strings.LastIndex(rest, "@")+1:]
	case secret.UserInfoBeyond:
		return l, fmt.Errorf("%w: proxy URL %s: the '@' that ends its user-info comes after a raw '+', which ends a layer: %s", ErrSyntax, shown, encodeHint)
	}
	u, err := url.Parse(text)
	if err != nil {
		if ui == secret.UserInfoHere {
			// Without the user-info, the error is the host's, which
			// may be shown; if there is none, the user-info is at fault.
			hostPart := rest[strings.LastIndex(rest, "@")+1:]
			if _, herr := url.Parse(scheme + "://" + hostPart); herr != nil {
				var ue *url.Error
				if errors.As(herr, &ue) {
					herr = ue.Err // without the URL
				}
				return l, fmt.Errorf("%w: proxy URL %s: %v", ErrSyntax, shown, herr)
			}
		}
		return l, fmt.Errorf("%w: proxy URL %s does not read as scheme://[user[:password]@]host[:port]: %s", ErrSyntax, shown, encodeHint)
	}
	host, port := u.Hostname(), u.Port()
	hostShown := host // in hints; not when it may be a user name
	if ui == secret.UserInfoUnknown {
		hostShown = "HOST"
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return l, fmt.Errorf("%w: proxy URL %s: a proxy URL is scheme://[user[:password]@]host[:port], with no path, query or fragment: %s", ErrSyntax, shown, encodeHint)
	}
	if host == "" {
		return l, fmt.Errorf("%w: proxy URL %s without a host", ErrSyntax, shown)
	}
	if port == "" {
		if scheme == "http" {
			return l, fmt.Errorf("%w: proxy URL %s: an http proxy URL needs its port (%s:3128, say)", ErrSyntax, shown, hostShown)
		}
		port = defaultProxyPort
	}
	maps.Copy(l.Params, proto.Params)
	l.Params["addr"] = net.JoinHostPort(host, port)
	if u.User != nil {
		l.Params["user"] = u.User.Username()
		if pw, ok := u.User.Password(); ok {
			if proto.Name == "socks4" || proto.Name == "socks4a" {
				return l, fmt.Errorf("%w: SOCKS4 has no passwords: give only a user id (%s://USER@%s)", ErrSyntax, scheme, hostShown)
			}
			l.Params["password"] = pw
		}
	}
	return l, nil
}

// validate checks every layer against the registry and the stack's shape:
// mirrored layers (filters, multi-link) above factories, and a terminal
// factory at the bottom (tcp is appended if missing).
func (s *Stack) validate(text string) error {
	if text == "" {
		text = s.String()
	}
	seenFactory, seenRoute := false, false
	for i := range s.Layers {
		l := &s.Layers[i]
		fail := func(err error) error { return &StackError{Stack: text, Index: i + 1, Layer: l.Name, Err: err} }
		spec := lookup(l.Name)
		if spec == nil {
			return fail(fmt.Errorf("%w (known: %s)", ErrUnknownLayer, strings.Join(layer.Names(), ", ")))
		}
		if err := spec.Check(l.Params); err != nil {
			return fail(err)
		}
		switch {
		case spec.Kind == layer.KindFactory:
			seenFactory = true
			if spec.Terminal && i != len(s.Layers)-1 {
				return fail(fmt.Errorf("%w: %s reaches the network itself and must be the last layer", ErrBadStack, l.Name))
			}
		case seenFactory:
			return fail(fmt.Errorf("%w: a %s must sit above every factory", ErrBadStack, spec.Kind))
		case spec.Kind == layer.KindRoute:
			seenRoute = true
			if _, _, err := l.build(); err != nil { // its node's address, checked now
				return fail(errors.Unwrap(err))
			}
		case seenRoute:
			return fail(fmt.Errorf("%w: a %s must sit above every route layer: the layers above a route run end to end", ErrBadStack, spec.Kind))
		}
	}
	if len(s.routes()) > MaxHops {
		return &StackError{Stack: text, Err: fmt.Errorf("%w: %d route layers, at most %d", ErrLoop, len(s.routes()), MaxHops)}
	}
	if n := len(s.Layers); n == 0 || !lookup(s.Layers[n-1].Name).Terminal {
		if lookup("tcp") == nil {
			return &StackError{Stack: text, Err: fmt.Errorf("%w: stack needs a terminal factory and tcp is not registered", ErrBadStack)}
		}
		s.Layers = append(s.Layers, Layer{Name: "tcp"})
	}
	return nil
}

// String returns the stack's canonical text form: parameters sorted by
// name, values escaped, what may be a secret shown as REDACTED (a
// proxy's password and user name, and a parameter its layer's schema
// does not know), so that it can be logged. Parse(s.String()) gives back
// an equal stack, but for the secrets.
func (s Stack) String() string { return s.format(true) }

// text is the canonical text form with the secrets in it, for the text
// to be parsed again, never shown.
func (s Stack) text() string { return s.format(false) }

func (s Stack) format(redact bool) string {
	var b strings.Builder
	for i, l := range s.Layers {
		if i > 0 {
			b.WriteByte('+')
		}
		l.format(&b, redact)
	}
	return b.String()
}

func (l Layer) String() string {
	var b strings.Builder
	l.format(&b, true)
	return b.String()
}

func (l Layer) format(b *strings.Builder, redact bool) {
	b.WriteString(l.Name)
	keys := make([]string, 0, len(l.Params))
	for k := range l.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for j, k := range keys {
		if j == 0 {
			b.WriteByte(':')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		if redact && l.secret(k) {
			b.WriteString("REDACTED")
			continue
		}
		escape(b, l.Params[k])
	}
}

// secret reports whether l's parameter k may hold a secret: unless its
// layer's schema names it and does not mark it Secret, as
// secret.StackText has it.
func (l Layer) secret(k string) bool {
	if spec := lookup(l.Name); spec != nil {
		p, ok := spec.Param(k)
		return !ok || p.Secret
	}
	return true
}

// secrets hashes the values of l's secret parameters: what tells two
// stacks apart that String shows alike. Empty without secrets.
func (s Stack) secrets() string {
	var all []string
	for i, l := range s.Layers {
		for k, v := range l.Params {
			if l.secret(k) {
				all = append(all, fmt.Sprintf("%d.%s=%q", i, k, v))
			}
		}
	}
	if len(all) == 0 {
		return ""
	}
	sort.Strings(all)
	sum := sha256.Sum256([]byte(strings.Join(all, ";")))
	return fmt.Sprintf("%x", sum[:8])
}

// IsPlain reports whether the stack has nothing for a peer to mirror and
// no node to go through, so a connection made with it is byte-for-byte
// the factory's stream.
func (s Stack) IsPlain() bool { return len(s.mirrored()) == 0 && len(s.routes()) == 0 }

// mirrored returns the layers above the topmost route layer or factory:
// the ones the peer rebuilds from the hello.
func (s Stack) mirrored() []Layer {
	for i, l := range s.Layers {
		if spec := lookup(l.Name); spec != nil && !spec.Kind.Mirrored() {
			return s.Layers[:i]
		}
	}
	return s.Layers
}

// routes returns the route layers (fwd), top first: the last one is the
// node the stack's factories reach.
func (s Stack) routes() []Layer {
	rest := s.Layers[len(s.mirrored()):]
	for i, l := range rest {
		if spec := lookup(l.Name); spec == nil || spec.Kind != layer.KindRoute {
			return rest[:i]
		}
	}
	return rest
}

// factories returns the factory layers, top first.
func (s Stack) factories() []Layer { return s.Layers[len(s.mirrored())+len(s.routes()):] }

// MarshalText implements encoding.TextMarshaler with the text form.
func (s Stack) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with Parse.
func (s *Stack) UnmarshalText(b []byte) error {
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// LayerConfig is the structured form of one layer, for config files:
// {"layer": "zstd", "params": {"level": 3}}. Parameter values may be
// strings, numbers or bools.
type LayerConfig struct {
	Layer  string         `json:"layer" toml:"layer"`
	Params map[string]any `json:"params,omitempty" toml:"params,omitempty"`
}

// FromConfig builds and validates a stack from its structured form.
func FromConfig(layers []LayerConfig) (Stack, error) {
	var s Stack
	for i, lc := range layers {
		l := Layer{Name: lc.Layer}
		if len(lc.Params) > 0 {
			l.Params = make(map[string]string, len(lc.Params))
		}
		for k, v := range lc.Params {
			switch v := v.(type) {
			case string:
				l.Params[k] = v
			case bool, int, int64, uint64, float64:
				l.Params[k] = fmt.Sprint(v)
			default:
				return Stack{}, &StackError{Stack: "(structured)", Index: i + 1, Layer: lc.Layer,
					Err: fmt.Errorf("%w: parameter %s: unsupported value type %T", ErrBadParam, k, v)}
			}
		}
		s.Layers = append(s.Layers, l)
	}
	for i := range s.Layers {
		if !layer.ValidName(s.Layers[i].Name) {
			return Stack{}, &StackError{Stack: s.String(), Index: i + 1, Layer: s.Layers[i].Name,
				Err: fmt.Errorf("%w: layer name %q", ErrSyntax, s.Layers[i].Name)}
		}
	}
	if err := s.validate(""); err != nil {
		return Stack{}, err
	}
	return s, nil
}

// Config returns the structured form of the stack.
func (s Stack) Config() []LayerConfig {
	out := make([]LayerConfig, len(s.Layers))
	for i, l := range s.Layers {
		out[i].Layer = l.Name
		if len(l.Params) > 0 {
			out[i].Params = make(map[string]any, len(l.Params))
			for k, v := range l.Params {
				out[i].Params[k] = v
			}
		}
	}
	return out
}

// MarshalJSON writes the structured form.
func (s Stack) MarshalJSON() ([]byte, error) { return json.Marshal(s.Config()) }

// UnmarshalJSON accepts either the text form (a JSON string) or the
// structured form (an array of LayerConfig).
func (s *Stack) UnmarshalJSON(b []byte) error {
	var text string
	if json.Unmarshal(b, &text) == nil {
		return s.UnmarshalText([]byte(text))
	}
	var lcs []LayerConfig
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&lcs); err != nil {
		return fmt.Errorf("vlink: stack: %w", err)
	}
	p, err := FromConfig(lcs)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

const hexDigits = "0123456789ABCDEF"

func needsEscape(c byte) bool {
	return c <= ' ' || c >= 0x7f || c == '%' || c == '+' || c == ',' || c == '"' || c == '\'' || c == '\\'
}

func escape(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if needsEscape(c) {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		} else {
			b.WriteByte(c)
		}
	}
}

func unescape(v string) (string, error) {
	if !strings.ContainsRune(v, '%') {
		return v, nil
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			out = append(out, v[i])
			continue
		}
		if i+2 >= len(v) || unhex(v[i+1]) < 0 || unhex(v[i+2]) < 0 {
			return "", fmt.Errorf("bad escape at %q: write %%XX with two hex digits", v[i:])
		}
		out = append(out, byte(unhex(v[i+1])<<4|unhex(v[i+2])))
		i += 2
	}
	return string(out), nil
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}

// lookup returns the registered layer with the given name, or nil.
func lookup(name string) *layer.Spec {
	s, ok := layer.Lookup(name)
	if !ok {
		return nil
	}
	return &s
}

// build instantiates a layer.
func (l Layer) build() (*layer.Spec, any, error) {
	spec := lookup(l.Name)
	if spec == nil {
		return nil, nil, fmt.Errorf("%w %q", ErrUnknownLayer, l.Name)
	}
	v, err := spec.Build(l.Params)
	if err != nil {
		return spec, nil, fmt.Errorf("vlink: layer %s: %w", l.Name, err)
	}
	return spec, v, nil
}

package secret

import (
	"net/url"
	"strings"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Redacted stands for what a stack's text shows in place of a secret.
const Redacted = "REDACTED"

// ProxySchemes are the schemes of the proxy URLs a stack takes as layers
// (see vlink.Stack).
var ProxySchemes = []string{"socks5", "socks5h", "socks4", "socks4a", "http"}

// A StackText is a stack's text cut where the parser cuts it ('+'
// between layers, ',' between parameters), knowing what of each part
// may be shown. The rule, for text well-formed or not:
//
//   - a parameter's value is shown only if its layer is registered and
//     its schema names the parameter and does not mark it Secret: a
//     name the schema does not know (pasword, pw) cannot be known safe;
//   - a proxy URL's user-info, the user name too, is never shown: it
//     runs from "://" to the URL's last '@';
//   - a raw ',' or '+' in a secret cuts it where the parser cuts: what
//     follows a hidden value, up to the first parameter its layer's
//     schema knows or the first layer the registry knows (with only
//     parameters its schema knows; or a proxy URL), may be the rest of
//     it and is not shown either, not even its names. So a URL's
//     user-info ends at the last '@' before such a layer; a URL without
//     an '@' that does not parse, or that such a layer follows, may be
//     a user:password that lost its host: it shows only its scheme, and
//     hides what follows it likewise.
//
// A raw ',' or '+' followed by what reads as a known parameter or layer
// ends the secret there: nothing can tell it from one.
type StackText struct {
	layers []LayerText
	shown  string
}

// A LayerText is one layer of a StackText: the text between two '+'.
type LayerText struct {
	// RestOf is, for a layer that may be the rest of an earlier one's
	// secret (a value or a URL's user-info, cut at a raw '+'), that
	// layer's index plus one; 0 otherwise. None of its text may be shown.
	RestOf int
	// URL says, for a proxy URL, where its user-info ends.
	URL URLUserInfo
	// password: the URL's user-info holds a ':', so a password.
	password bool
	// Params are the layer's parameters, for a layer that is no URL.
	Params []ParamText
}

// URLUserInfo says where a proxy URL's user-info ends.
type URLUserInfo uint8

const (
	// NoUserInfo: the URL has no '@', parses, and a layer the registry
	// knows (or none) follows: what follows "://" is its host.
	NoUserInfo URLUserInfo = iota
	// UserInfoHere: the user-info ends at the URL's last '@', in this
	// layer; what follows it is the host.
	UserInfoHere
	// UserInfoBeyond: the URL's last '@' is in a later layer (a raw '+'
	// cut the user-info), so all this layer has after "://" is
	// user-info.
	UserInfoBeyond
	// UserInfoUnknown: the URL has no '@', yet does not parse or a layer
	// not known follows: it may be a user:password that lost its host,
	// cut by a raw '+'; nothing after "://" may be shown.
	UserInfoUnknown
)

// A ParamText is one parameter of a LayerText: the text between two ','.
type ParamText struct {
	// RestOf names the parameter whose hidden value this one may be the
	// rest of (cut at a raw ','); "" otherwise. None of its text may be
	// shown.
	RestOf string
	// ShowValue reports whether its value may be shown.
	ShowValue bool
}

// ReadStack cuts a stack's text as the parser does and decides what of
// it may be shown (see StackText).
func ReadStack(text string) *StackText {
	segs := strings.Split(text, "+")
	st := &StackText{layers: make([]LayerText, len(segs))}
	var shown []string
	restOf := 0 // 1 + the layer whose secret may run on past a '+'
	for i := 0; i < len(segs); i++ {
		s, lt := segs[i], &st.layers[i]
		if restOf > 0 && !knownLayer(s) {
			lt.RestOf = restOf
			continue
		}
		restOf = 0
		if scheme, rest, ok := strings.Cut(s, "://"); ok {
			// The user-info ends at the last '@' before the next layer
			// that is known: a raw '+' in it cuts the URL in layers.
			end := i + 1
			for end < len(segs) && !knownLayer(segs[end]) {
				end++
			}
			at := -1 // the layer holding the last '@'
			for j := end - 1; j > i && at < 0; j-- {
				if strings.Contains(segs[j], "@") {
					at = j
				}
			}
			if at < 0 && strings.Contains(rest, "@") {
				at = i
			}
			switch {
			case at == i:
				lt.URL = UserInfoHere
				lt.password = strings.Contains(rest[:strings.LastIndex(rest, "@")], ":")
				shown = append(shown, scheme+"://"+Redacted+"@"+rest[strings.LastIndex(rest, "@")+1:])
			case at > i:
				lt.URL = UserInfoBeyond
				lt.password = strings.Contains(strings.Join(append([]string{rest}, segs[i+1:at+1]...), "+"), ":")
				for j := i + 1; j <= at; j++ {
					st.layers[j].RestOf = i + 1
				}
				host := segs[at][strings.LastIndex(segs[at], "@")+1:]
				shown = append(shown, scheme+"://"+Redacted+"@"+host)
				i = at
			default:
				// No '@': what follows "://" is a host, unless the user
				// left it out and this is user:password, which shows
				// when it does not parse or a layer not known follows.
				if _, err := url.Parse(s); err == nil && end == i+1 {
					shown = append(shown, s)
				} else {
					lt.URL = UserInfoUnknown
					shown = append(shown, scheme+"://"+Redacted)
					restOf = i + 1
				}
			}
			continue
		}
		name, params, hasParams := strings.Cut(s, ":")
		if !hasParams {
			shown = append(shown, s)
			continue
		}
		spec, _ := layer.Lookup(name) // a zero Spec knows no parameter
		kvs := strings.Split(params, ",")
		lt.Params = make([]ParamText, len(kvs))
		out := make([]string, 0, len(kvs))
		hidden := "" // the parameter whose value may run on past a ','
		for j, kv := range kvs {
			k, _, hasValue := strings.Cut(kv, "=")
			p, known := spec.Param(k)
			if hidden != "" && !known {
				lt.Params[j].RestOf = hidden
				continue
			}
			hidden = ""
			if !hasValue || known && !p.Secret {
				lt.Params[j].ShowValue = true
				out = append(out, kv)
				continue
			}
			out = append(out, k+"="+Redacted)
			hidden = k
		}
		shown = append(shown, name+":"+strings.Join(out, ","))
		if hidden != "" {
			restOf = i + 1
		}
	}
	st.shown = strings.Join(shown, "+")
	return st
}

// knownLayer reports whether a layer's text is what the parser reads as
// a layer of its own, not the rest of a secret: a registered layer with
// only parameters its schema knows, or a proxy URL.
func knownLayer(s string) bool {
	if scheme, _, ok := strings.Cut(s, "://"); ok {
		for _, p := range ProxySchemes {
			if strings.EqualFold(scheme, p) {
				return true
			}
		}
		return false
	}
	name, params, hasParams := strings.Cut(s, ":")
	spec, ok := layer.Lookup(name)
	if !ok {
		return false
	}
	if hasParams {
		for kv := range strings.SplitSeq(params, ",") {
			k, _, _ := strings.Cut(kv, "=")
			if _, known := spec.Param(k); !known {
				return false
			}
		}
	}
	return true
}

// String returns the text with what may not be shown replaced by
// REDACTED, and the rest of a secret cut at a raw ',' or '+' left out.
func (t *StackText) String() string { return t.shown }

// Layer returns the i'th layer (from 0) of the text.
func (t *StackText) Layer(i int) LayerText {
	if i < 0 || i >= len(t.layers) {
		return LayerText{}
	}
	return t.layers[i]
}

// Param returns the j'th parameter (from 0) of the layer.
func (l LayerText) Param(j int) ParamText {
	if j < 0 || j >= len(l.Params) {
		return ParamText{}
	}
	return l.Params[j]
}

// RedactStack returns a stack's text form, as given, well-formed or not,
// with every value that may be a secret, and all of a proxy URL's
// user-info, replaced by REDACTED (see StackText for the rule). Stacks
// are logged and printed: this is the form to show.
func RedactStack(text string) string { return ReadStack(text).String() }

// HasPassword reports whether a stack's text holds a password: a proxy
// URL's (user:password@), or the value of a parameter whose name says
// it is a secret (Name). A user name alone is no password.
func HasPassword(text string) bool {
	st := ReadStack(text)
	for i, s := range strings.Split(text, "+") {
		lt := st.Layer(i)
		switch {
		case lt.RestOf > 0:
		case lt.password:
			return true
		case lt.URL == NoUserInfo:
			_, params, _ := strings.Cut(s, ":")
			for kv := range strings.SplitSeq(params, ",") {
				if k, _, hasValue := strings.Cut(kv, "="); hasValue && Name(k) {
					return true
				}
			}
		}
	}
	return false
}

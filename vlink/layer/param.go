package layer

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vlink-dev/vlink/internal/units"
)

// ParamType is the type of a layer parameter's value.
type ParamType uint8

const (
	// TypeString values are taken as written.
	TypeString ParamType = iota
	// TypeInt values are decimal integers within [Param.Min, Param.Max].
	TypeInt
	// TypeBool values are true/false (also 1/0, yes/no, on/off); a
	// parameter written without "=value" is true.
	TypeBool
	// TypeDuration values are Go durations ("10s", "1m30s") within
	// [Param.Min, Param.Max] nanoseconds.
	TypeDuration
	// TypeSize values are byte counts with an optional K, M or G suffix
	// (powers of 1024) within [Param.Min, Param.Max].
	TypeSize
)

func (t ParamType) String() string {
	switch t {
	case TypeString:
		return "string"
	case TypeInt:
		return "int"
	case TypeBool:
		return "bool"
	case TypeDuration:
		return "duration"
	case TypeSize:
		return "size"
	}
	return fmt.Sprintf("ParamType(%d)", uint8(t))
}

// Param is one entry of a layer's parameter schema.
type Param struct {
	Name string
	Type ParamType
	// Default is the value used when the parameter is absent, in the same
	// text form as in a stack spec. Empty means the zero value.
	Default string
	// Min and Max bound numeric values (inclusive). Both zero means
	// unbounded.
	Min, Max int64
	// Local marks a parameter that only matters on the side that wrote it
	// (a compression level, a socket option). The peer still receives it
	// in the hello but its policy bounds are not applied to it.
	Local bool
	// Required marks a parameter a stack must give (a proxy's address):
	// parsing fails without it. A required parameter has no Default.
	Required bool
	// Secret marks a parameter that holds a secret itself (a password
	// from a proxy URL) or a proxy URL's user name (user-info is never
	// shown, any part of it): a stack's String shows REDACTED for its
	// value, so no log or error holds it. Only factories have secrets:
	// what is mirrored goes to the peer in the hello.
	Secret bool
	// Hop marks a parameter naming the host a factory connects to itself
	// (a proxy's HOST:PORT, an SSH server's [user@]host[:port]): the
	// first hop of the path, which the destination's address does not
	// show. A dialer with a key encrypts end to end when any hop is
	// beyond loopback, as it does for a destination beyond loopback: the
	// listener then sees the hop's loopback address and cannot ask for it.
	Hop bool
	Doc string
}

// ErrBadParam is matched by errors about a parameter value. Package vlink
// returns the same error (vlink.ErrBadParam) from stack parsing, so a layer
// whose New rejects a value wraps it too.
var ErrBadParam = errors.New("bad parameter")

// Check validates a value against the schema entry: its type, then its
// bounds.
func (p *Param) Check(v string) error {
	n, err := p.Value(v)
	if err != nil {
		return err
	}
	if p.Type == TypeString || p.Type == TypeBool || (p.Min == 0 && p.Max == 0) {
		return nil
	}
	if n < p.Min || n > p.Max {
		return fmt.Errorf("%w: %s=%s is outside [%s, %s]", ErrBadParam, p.Name, v, p.Format(p.Min), p.Format(p.Max))
	}
	return nil
}

// Value returns the numeric value of v: the integer, the duration in
// nanoseconds, the size in bytes, 1 or 0 for a bool, 0 for a string. It
// does not check the bounds.
func (p *Param) Value(v string) (int64, error) {
	switch p.Type {
	case TypeString:
		return 0, nil
	case TypeInt:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrBadParam, p.Name, v)
		}
		return n, nil
	case TypeBool:
		b, ok := parseBool(v)
		if !ok {
			return 0, fmt.Errorf("%w: %s=%q is not true or false", ErrBadParam, p.Name, v)
		}
		if b {
			return 1, nil
		}
		return 0, nil
	case TypeDuration:
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q is not a duration like 10s", ErrBadParam, p.Name, v)
		}
		return int64(d), nil
	case TypeSize:
		n, err := units.ParseSize(v)
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q is not a size like 64K", ErrBadParam, p.Name, v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: %s has unknown type", ErrBadParam, p.Name)
}

// Format writes a numeric value as a stack would: "10s" for a duration,
// "64K" for a size.
func (p *Param) Format(n int64) string {
	switch p.Type {
	case TypeDuration:
		return time.Duration(n).String()
	case TypeSize:
		return units.FormatSize(n)
	}
	return strconv.FormatInt(n, 10)
}

func parseBool(v string) (bool, bool) {
	switch v {
	case "", "1", "true", "yes", "on":
		return true, true
	case "0", "false", "no", "off":
		return false, true
	}
	return false, false
}

// Args are a layer's checked parameter values, handed to [Spec.New].
// Absent parameters read as their schema default. Asking for a name the
// schema lacks panics: it is a bug in the layer.
type Args struct {
	spec *Spec
	vals map[string]string
}

func (a Args) raw(name string) (*Param, string) {
	p := a.spec.param(name)
	if p == nil {
		panic(fmt.Sprintf("vlink: layer %s has no parameter %q", a.spec.Name, name))
	}
	if v, ok := a.vals[name]; ok {
		return p, v
	}
	return p, p.Default
}

// Has reports whether the parameter was given explicitly.
func (a Args) Has(name string) bool { _, ok := a.vals[name]; return ok }

// String returns a string parameter.
func (a Args) String(name string) string { _, v := a.raw(name); return v }

// Int returns an int parameter.
func (a Args) Int(name string) int { return int(a.num(name)) }

// Bool returns a bool parameter.
func (a Args) Bool(name string) bool { return a.num(name) != 0 }

// Duration returns a duration parameter.
func (a Args) Duration(name string) time.Duration { return time.Duration(a.num(name)) }

// Size returns a size parameter in bytes.
func (a Args) Size(name string) int64 { return a.num(name) }

func (a Args) num(name string) int64 {
	p, v := a.raw(name)
	if v == "" && p.Type != TypeBool {
		return 0
	}
	if v == "" { // an absent bool with no default is false
		if _, given := a.vals[name]; !given {
			return 0
		}
	}
	n, err := p.Value(v)
	if err != nil {
		panic(fmt.Sprintf("vlink: layer %s: unchecked parameter: %v", a.spec.Name, err))
	}
	return n
}

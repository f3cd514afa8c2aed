package layer

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
)

type nopFilter struct{}

func (nopFilter) Client(c net.Conn) (net.Conn, error) { return c, nil }
func (nopFilter) Server(c net.Conn) (net.Conn, error) { return c, nil }

// every holds a parameter of each type, with defaults and bounds.
var every = Spec{
	Name: "test-every", Kind: KindFilter, Summary: "parameters of every type",
	Params: []Param{
		{Name: "level", Type: TypeInt, Default: "3", Min: 1, Max: 9},
		{Name: "name", Type: TypeString},
		{Name: "flag", Type: TypeBool},
		{Name: "on", Type: TypeBool, Default: "true"},
		{Name: "wait", Type: TypeDuration, Default: "1s", Min: 0, Max: int64(1e12)},
		{Name: "window", Type: TypeSize, Default: "64K", Min: 1 << 10, Max: 1 << 20},
		{Name: "addr", Type: TypeString, Required: true, Doc: "where"},
	},
	New: func(a Args) (any, error) { return a, nil },
}

func init() { Register(every) }

func build(t *testing.T, params map[string]string) Args {
	t.Helper()
	s, ok := Lookup("test-every")
	if !ok {
		t.Fatal("test-every is not registered")
	}
	v, err := s.Build(params)
	if err != nil {
		t.Fatal(err)
	}
	return v.(Args)
}

func TestArgs(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		a := build(t, map[string]string{"addr": "p:1"})
		if a.Int("level") != 3 || a.Bool("flag") || !a.Bool("on") || a.Size("window") != 64<<10 ||
			a.Duration("wait").Seconds() != 1 || a.String("name") != "" || a.Has("level") {
			t.Fatalf("defaults not applied: level=%d flag=%v on=%v window=%d wait=%v", a.Int("level"), a.Bool("flag"), a.Bool("on"), a.Size("window"), a.Duration("wait"))
		}
	})
	t.Run("given", func(t *testing.T) {
		a := build(t, map[string]string{"addr": "p:1", "level": "7", "flag": "", "on": "off", "window": "1M", "wait": "250ms", "name": "x"})
		if a.Int("level") != 7 || !a.Bool("flag") || a.Bool("on") || a.Size("window") != 1<<20 ||
			a.Duration("wait").Milliseconds() != 250 || a.String("name") != "x" || !a.Has("level") {
			t.Fatalf("values not read: level=%d flag=%v on=%v window=%d wait=%v", a.Int("level"), a.Bool("flag"), a.Bool("on"), a.Size("window"), a.Duration("wait"))
		}
	})
	t.Run("unknown name panics", func(t *testing.T) {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `no parameter "nope"`) {
				t.Fatalf("recover() = %v", r)
			}
		}()
		build(t, nil).Int("nope")
	})
}

func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		name    string
		params  map[string]string
		mention string // empty: valid
	}{
		{"valid", map[string]string{"addr": "p:1", "level": "9", "window": "1K"}, ""},
		{"missing required", map[string]string{}, "missing required parameter addr (where)"},
		{"unknown", map[string]string{"addr": "p", "levle": "3"}, `unknown parameter "levle" (known: level, name`},
		{"not an integer", map[string]string{"addr": "p", "level": "x"}, "not an integer"},
		{"above max", map[string]string{"addr": "p", "level": "10"}, "level=10 is outside [1, 9]"},
		{"size bounds", map[string]string{"addr": "p", "window": "2M"}, "window=2M is outside [1K, 1M]"},
		{"not a size", map[string]string{"addr": "p", "window": "big"}, "not a size"},
		{"not a duration", map[string]string{"addr": "p", "wait": "soon"}, "not a duration"},
		{"not a bool", map[string]string{"addr": "p", "flag": "maybe"}, "not true or false"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := every.Check(tt.params)
			if tt.mention == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrBadParam) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("Check = %v, want ErrBadParam mentioning %q", err, tt.mention)
			}
		})
	}
	none := Spec{Name: "test-none", Kind: KindFilter, New: every.New}
	if err := none.Check(map[string]string{"x": "1"}); !errors.Is(err, ErrBadParam) || !strings.Contains(err.Error(), "test-none takes none") {
		t.Fatalf("Check on a layer without parameters = %v", err)
	}
}

func TestRegisterRejects(t *testing.T) {
	newf := func(Args) (any, error) { return nopFilter{}, nil }
	for _, tt := range []struct {
		name    string
		spec    Spec
		mention string
	}{
		{"duplicate", Spec{Name: "test-every", Kind: KindFilter, New: newf}, "registered twice"},
		{"bad name", Spec{Name: "Bad_Name", Kind: KindFilter, New: newf}, "invalid layer name"},
		{"no New", Spec{Name: "test-nonew", Kind: KindFilter}, "New is nil"},
		{"no kind", Spec{Name: "test-nokind", New: newf}, "invalid kind"},
		{"terminal filter", Spec{Name: "test-term", Kind: KindFilter, Terminal: true, New: newf}, "only factories"},
		{"node factory not terminal", Spec{Name: "test-nodes", Kind: KindFactory, Nodes: true, New: newf}, "reaches nodes is terminal"},
		{"duplicate parameter", Spec{Name: "test-dup", Kind: KindFilter, New: newf,
			Params: []Param{{Name: "a"}, {Name: "a"}}}, "duplicate parameter"},
		{"required with default", Spec{Name: "test-reqdef", Kind: KindFilter, New: newf,
			Params: []Param{{Name: "a", Required: true, Default: "x"}}}, "has a default"},
		{"default out of bounds", Spec{Name: "test-baddef", Kind: KindFilter, New: newf,
			Params: []Param{{Name: "a", Type: TypeInt, Default: "0", Min: 1, Max: 2}}}, "default of a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), tt.mention) {
					t.Fatalf("Register panicked with %v, want a panic mentioning %q", r, tt.mention)
				}
				if tt.name != "duplicate" {
					if _, ok := Lookup(tt.spec.Name); ok {
						t.Fatalf("%s was registered after all", tt.spec.Name)
					}
				}
			}()
			Register(tt.spec)
		})
	}
}

func TestSpecsSorted(t *testing.T) {
	for _, n := range []string{"test-zz", "test-aa"} {
		Register(Spec{Name: n, Kind: KindFilter, New: func(Args) (any, error) { return nopFilter{}, nil }})
	}
	names := Names()
	if !slices.IsSorted(names) || !slices.Contains(names, "test-aa") || !slices.Contains(names, "test-every") {
		t.Fatalf("Names() = %v, want a sorted list with every registered layer", names)
	}
	if got := len(Specs()); got != len(names) {
		t.Fatalf("Specs() has %d entries, Names() %d", got, len(names))
	}
}

func TestKind(t *testing.T) {
	for k, want := range map[Kind]bool{KindFactory: false, KindFilter: true, KindMultiLink: true} {
		if k.Mirrored() != want {
			t.Errorf("%v.Mirrored() = %v", k, !want)
		}
	}
}

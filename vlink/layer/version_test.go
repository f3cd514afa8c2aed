package layer

import (
	"errors"
	"testing"
)

// TestArgsVersion: Args.Version is the version a stack names, else the
// schema's default, and 1 for a layer without versions; one the layer does
// not speak is a *VersionError, a bad parameter.
func TestArgsVersion(t *testing.T) {
	versioned := &Spec{Name: "test-versioned", Params: []Param{Version(2, 3, 3)}}
	plain := &Spec{Name: "test-plain"}
	for _, tc := range []struct {
		spec   *Spec
		params map[string]string
		want   int // 0 for a *VersionError
	}{
		{versioned, nil, 3},
		{versioned, map[string]string{VersionParam: "2"}, 2},
		{versioned, map[string]string{VersionParam: "1"}, 0},
		{versioned, map[string]string{VersionParam: "4"}, 0},
		{plain, nil, BaseVersion},
	} {
		got, err := Args{spec: tc.spec, vals: tc.params}.Version()
		var ve *VersionError
		switch {
		case tc.want == 0 && (!errors.As(err, &ve) || !errors.Is(err, ErrBadParam)):
			t.Errorf("%s %v: %d, %v; want a *VersionError matching ErrBadParam", tc.spec.Name, tc.params, got, err)
		case tc.want != 0 && (err != nil || got != tc.want):
			t.Errorf("%s %v: %d, %v; want %d", tc.spec.Name, tc.params, got, err, tc.want)
		}
	}
}

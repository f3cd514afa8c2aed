package tomlerr

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestNew(t *testing.T) {
	type route struct {
		Stack string `toml:"stack"`
		Level int    `toml:"level"`
	}
	for _, tc := range []struct {
		name, doc string
		want      string
	}{
		{"unknown keys", "pasword = \"S3cret\"\n[[route]]\nstack = \"S3cret\"\nstak = \"S3cret\"\n",
			`f.toml:1: unknown key "pasword"; f.toml:4: unknown key "route.stak"`},
		{"syntax", "[[route]]\nstack = \"S3cret\\Qu1x\"\n", "f.toml:2:"},
		{"type", "[[route]]\nlevel = \"S3cret\"\n", "f.toml:2:9: route.level: toml: cannot decode TOML string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f struct {
				Route []route `toml:"route"`
			}
			dec := toml.NewDecoder(bytes.NewReader([]byte(tc.doc)))
			dec.DisallowUnknownFields()
			err := New("f.toml", dec.Decode(&f))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, tc.want) || strings.Contains(msg, "S3cret") || strings.Contains(msg, "'Q'") {
				t.Errorf("error %q: want it to start with %q and show no value", msg, tc.want)
			}
		})
	}
}

package fwd_test

import (
	"errors"
	"strings"
	"testing"

	_ "github.com/vlink-dev/vlink/factories/tcp"
	_ "github.com/vlink-dev/vlink/filters/fwd"
	"github.com/vlink-dev/vlink/vlink"
)

func TestVia(t *testing.T) {
	for _, tc := range []struct{ stack, want string }{
		{"fwd:via=gw.example:7000", ""},
		{"fwd:via=[fd00::1]:7000+fwd:via=10.0.0.1:7000", ""},
		{"fwd:via=gw.example", "missing port"},
		{"fwd:via=gw.example:ssh", `port "ssh" is not a number`},
		{"fwd:via=:7000", "empty host"},
		{"fwd:via=gw:0", `port "0"`},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			_, err := vlink.Parse(tc.stack)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, vlink.ErrBadParam)):
				t.Fatalf("Parse = %v, want ErrBadParam saying %q", err, tc.want)
			}
		})
	}
}

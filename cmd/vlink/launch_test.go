package main

import (
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

// TestLaunchUsage checks what vlink launch says of a missing or bad
// worker count.
func TestLaunchUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--", "true"}, "--n N is required"},
		{[]string{"--n", "0", "--", "true"}, "--n 0: want 1 to 4096 workers"},
		{[]string{"-n", "5000", "--", "true"}, "--n 5000: want 1 to 4096 workers"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runSync(append([]string{"launch"}, tc.args...)...)
			if code != base.ExitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d (want %d), stderr does not say %q:\n%s", code, base.ExitUsage, tc.want, stderr)
			}
		})
	}
}

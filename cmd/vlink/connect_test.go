package main

import (
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

func TestConnectUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no destination"},
		{[]string{"db.internal"}, "want HOST:PORT, or HOST PORT"},
		{[]string{"a", "b", "c"}, "3 arguments"},
		{[]string{"127.0.0.1:22", "--stack", "zstd"}, "flags go before HOST:PORT"},
		{[]string{"--via", "127.0.0.1:7000", "127.0.0.1:22"}, "need --stack"},
		{[]string{"--stack", "brotli", "127.0.0.1:22"}, "unknown layer"},
		{[]string{"--stack", "tcp", "--dial-timeout", "0s", "127.0.0.1:22"}, "--dial-timeout wants a positive duration"},
		{[]string{"--stack", "tcp", "db.vlink.alt:22"}, "names a node of a vlink network"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runSync(append([]string{"connect"}, tc.args...)...)
			if code != base.ExitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
				t.Errorf("exit code %d (want %d), stdout %q, stderr does not say %q:\n%s", code, base.ExitUsage, stdout, tc.want, stderr)
			}
		})
	}
	// Two arguments are ssh's %h %p, an IPv6 address among them.
	code, stdout, stderr := runSync("connect", "--stack", "tcp", "--dial-timeout", "2s", "::1", "1")
	if code != base.ExitFailure || !strings.Contains(stderr, "[::1]:1") || stdout != "" {
		t.Errorf("connect ::1 1: exit code %d (want %d, a refused connection to [::1]:1), stderr:\n%s", code, base.ExitFailure, stderr)
	}
}

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

// TestKeyFileWithoutHello checks that the dialing commands refuse a
// --key-file their --stack cannot carry (no layer to mirror, so no hello),
// saying what to write instead.
func TestKeyFileWithoutHello(t *testing.T) {
	key := writeKey(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tunnel", "--to", "127.0.0.1:1", "--stack", "quic", "--key-file", key}, "--key-file with --stack quic: that stack has no layer for the server to mirror"},
		{[]string{"connect", "--stack", "tcp", "--key-file", key, "127.0.0.1:1"}, "e.g. --stack zstd+tcp, or leave out --key-file"},
		{[]string{"socks", "--stack", "shm", "--key-file", key}, "--key-file with --stack shm"},
		{[]string{"exec", "--stack", "tcp", "--key-file", key, "--", "true"}, "--key-file with --stack tcp"},
	} {
		t.Run(strings.Join(tc.args[:3], " "), func(t *testing.T) {
			// Without the check the command would run: give it a while.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stdout, stderr output
			code := run(ctx, tc.args, &stdout, &stderr)
			if code != base.ExitUsage || !strings.Contains(stderr.String(), tc.want) || stdout.String() != "" {
				t.Errorf("exit code %d (want %d), stdout %q, stderr does not say %q:\n%s", code, base.ExitUsage, stdout.String(), tc.want, stderr.String())
			}
		})
	}
}

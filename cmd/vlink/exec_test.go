package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/execcmd"
	"github.com/vlink-dev/vlink/internal/testenv"
)

func TestExecUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exec"}, "no program to run"},
		{[]string{"exec", "--via", "127.0.0.1:7000", "--", "true"}, "need --stack"},
		{[]string{"exec", "--stack", "zstd", "--config", "x.toml", "--", "true"}, "not both"},
		{[]string{"exec", "--stack", "zstd:level=99", "--", "true"}, "outside [1, 22]"},
		{[]string{"exec", "--stack", "zstd", "--via", "nohostport", "--", "true"}, "want HOST:PORT"},
		{[]string{"exec", "--dial-timeout", "-1s", "--", "true"}, "positive duration"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runSync(tc.args...)
			if code != base.ExitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
				t.Errorf("exit code %d (want %d), stderr %q does not say %q", code, base.ExitUsage, stderr, tc.want)
			}
		})
	}
}

// The program's exit code passes through; a missing config file is
// vlink exec's own failure.
func TestExecExitCode(t *testing.T) {
	if runtime.GOOS != "linux" {
		code, _, stderr := runSync("exec", "--", "true")
		if code != execcmd.ExitExecFailed || !strings.Contains(stderr, "Linux-only") {
			t.Errorf("exit code %d, stderr %q", code, stderr)
		}
		return
	}
	testenv.Programs(t, "cc") // vlink exec builds the shim
	// Not VLINK_CONFIG: vlink.DefaultConfig reads it once per process.
	code, _, stderr := runSync("exec", "--config", "/nonexistent/vlink.toml", "--", "sh", "-c", "exit 3")
	if code != execcmd.ExitExecFailed || !strings.Contains(stderr, "/nonexistent/vlink.toml") {
		t.Errorf("a missing config: exit code %d, stderr %q", code, stderr)
	}
	code, _, stderr = runSync("exec", "--config", "/dev/null", "--", "sh", "-c", "exit 3")
	if code != 3 {
		t.Errorf("exit code %d, want the program's 3; stderr %q", code, stderr)
	}
}

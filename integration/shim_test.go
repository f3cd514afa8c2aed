//go:build linux

package integration

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestBuildShim builds the shim with vlink exec --build-shim, then runs
// vlink exec where no C compiler can be found: with VLINK_PRELOAD naming
// the built shim the program runs with it, without, vlink exec says how
// to get one.
func TestBuildShim(t *testing.T) {
	testenv.Programs(t, "cc", "sh")
	so := filepath.Join(t.TempDir(), "libvlink-preload.so")
	if out, err := exec.Command(vlinkBin, "exec", "--build-shim", so).CombinedOutput(); err != nil {
		t.Fatalf("vlink exec --build-shim: %v: %s", err, out)
	}
	bare := t.TempDir() // PATH without cc, and an empty cache
	noCC := func(extra ...string) *exec.Cmd {
		cmd := exec.Command(vlinkBin, "exec", "--stack", "tcp", "--", "/bin/sh", "-c", `echo "$LD_PRELOAD"`)
		cmd.Env = append([]string{"PATH=" + bare, "HOME=" + bare, "XDG_CACHE_HOME=" + bare}, extra...)
		return cmd
	}
	out, err := noCC("VLINK_PRELOAD=" + so).Output()
	if err != nil || !strings.Contains(string(out), so) {
		t.Errorf("vlink exec with VLINK_PRELOAD=%s and no cc: %v, the program saw LD_PRELOAD=%q", so, err, bytes.TrimSpace(out))
	}
	cmd := noCC()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 || !strings.Contains(stderr.String(), "VLINK_PRELOAD") {
		t.Errorf("vlink exec without cc or VLINK_PRELOAD: %v (want exit status 125), stderr:\n%s", err, stderr.String())
	}
}

//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// vlinkBin is the vlink command built for this run by TestMain.
var vlinkBin string

// TestMain builds cmd/vlink once for every test and benchmark, unless
// VLINK_BIN names a vlink binary to test instead (a release build, say).
// A build failure fails the whole run: nothing here is skipped silently.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vlink-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	vlinkBin = os.Getenv("VLINK_BIN")
	if vlinkBin == "" {
		vlinkBin = filepath.Join(dir, "vlink")
		build := exec.Command("go", "build", "-o", vlinkBin, "./cmd/vlink")
		build.Dir = ".." // the module root
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "integration: go build ./cmd/vlink: %v\n%s", err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	// vlink keeps the user's configuration and pins (known_nodes) under
	// XDG_CONFIG_HOME: the processes of the tests keep theirs here.
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(dir, "config"))
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		// exec.Cmd copies output with goroutines until Wait; every test
		// waits for its processes, so none may be left.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

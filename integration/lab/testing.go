package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Require skips tb unless labs can be brought up here (Linux, root,
// /dev/net/tun, iproute2) and the programs are on PATH; in CI
// (CI=true), where they must be, it fails tb instead.
func Require(tb testing.TB, programs ...string) {
	tb.Helper()
	err := Supported()
	if err == nil {
		var missing []string
		for _, p := range programs {
			if _, lerr := exec.LookPath(p); lerr != nil {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			err = fmt.Errorf("needs %s on PATH (integration/deps.sh installs it)", strings.Join(missing, ", "))
		}
	}
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal(err)
	}
	tb.Skip(err)
}

// New brings topo up for a test or benchmark and tears it down when tb
// ends (tb.Cleanup; a teardown error fails tb). Like Require, it skips
// where labs cannot run, except in CI.
func New(tb testing.TB, topo Topology) *Lab {
	tb.Helper()
	if err := topo.Validate(); err != nil {
		tb.Fatal(err)
	}
	Require(tb, topo.Programs()...)
	l, err := Up(context.Background(), topo)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Error(err)
		}
	})
	return l
}

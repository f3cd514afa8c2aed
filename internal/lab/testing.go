package lab

import (
	"context"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// Require skips tb unless labs can be brought up here (Linux, root,
// /dev/net/tun, iproute2) with the programs, or fails it where nothing may
// be skipped (package testenv decides).
func Require(tb testing.TB, programs ...string) {
	tb.Helper()
	testenv.Root(tb, "for the lab's network namespaces and devices")
	testenv.Programs(tb, append([]string{"ip"}, programs...)...)
	if err := Supported(); err != nil {
		testenv.Missing(tb, "%v", err)
	}
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

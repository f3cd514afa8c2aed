//go:build !linux

package layers_test

import (
	"testing"

	"github.com/vlink-dev/vlink/vlink"
)

// realFixture: the real servers are started on Linux only.
func realFixture(t *testing.T, layer string) (vlink.Stack, bool) { return vlink.Stack{}, false }

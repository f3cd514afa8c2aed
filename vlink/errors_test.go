package vlink_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// TestLayerErrors: a layer wraps package layer's sentinels (it never
// imports vlink), and a program matches them with vlink's names, so each
// pair is one value.
func TestLayerErrors(t *testing.T) {
	for _, tc := range []struct {
		name           string
		app, fromLayer error
	}{
		{"ErrAuth", vlink.ErrAuth, layer.ErrAuth},
		{"ErrNotAllowed", vlink.ErrNotAllowed, layer.ErrNotAllowed},
		{"ErrUnreachable", vlink.ErrUnreachable, layer.ErrUnreachable},
		{"ErrDirectRefused", vlink.ErrDirectRefused, layer.ErrDirectRefused},
		{"ErrBadParam", vlink.ErrBadParam, layer.ErrBadParam},
		{"ErrBusy", vlink.ErrBusy, layer.ErrBusy},
		{"ErrKeyRequired", vlink.ErrKeyRequired, layer.ErrKeyRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fmt.Errorf("socks: proxy %w", tc.fromLayer)
			if !errors.Is(err, tc.app) {
				t.Errorf("an error wrapping layer.%s does not match vlink.%s", tc.name, tc.name)
			}
		})
	}
	if vlink.DefaultHandshakeTimeout != layer.DefaultHandshakeTimeout {
		t.Errorf("vlink.DefaultHandshakeTimeout = %v, layer's %v", vlink.DefaultHandshakeTimeout, layer.DefaultHandshakeTimeout)
	}
}

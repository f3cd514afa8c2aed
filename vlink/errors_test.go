package vlink_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
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

// A listener's failed dial to its target becomes a refusal that carries
// the dial's errno class to the dialer, for its program.
func TestTargetRefusal(t *testing.T) {
	dialErr := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, tt := range []struct {
		name string
		err  error
		code vlink.RefuseCode
		want syscall.Errno
	}{
		{"refused", dialErr(os.NewSyscallError("connect", syscall.ECONNREFUSED)), vlink.CodeTargetRefused, syscall.ECONNREFUSED},
		{"no route", dialErr(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), vlink.CodeUnreachable, syscall.EHOSTUNREACH},
		{"timed out", dialErr(os.ErrDeadlineExceeded), vlink.CodeTargetTimeout, syscall.ETIMEDOUT},
		{"kernel timeout", dialErr(os.NewSyscallError("connect", syscall.ETIMEDOUT)), vlink.CodeTargetTimeout, syscall.ETIMEDOUT},
		{"context", context.DeadlineExceeded, vlink.CodeTargetTimeout, syscall.ETIMEDOUT},
		{"other", errors.New("proxy said no"), vlink.CodeUnreachable, syscall.EHOSTUNREACH},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := vlink.TargetRefusal(tt.err)
			if r.Code != tt.code {
				t.Fatalf("code %v, want %v", r.Code, tt.code)
			}
			var err error = r
			if !errors.Is(err, tt.want) || !errors.Is(err, vlink.ErrUnreachable) || !errors.Is(err, vlink.ErrRefused) {
				t.Fatalf("%v does not match %v, ErrUnreachable and ErrRefused", err, tt.want)
			}
			for _, other := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ETIMEDOUT, syscall.EHOSTUNREACH} {
				if other != tt.want && errors.Is(err, other) {
					t.Fatalf("%v matches %v too", err, other)
				}
			}
		})
	}
}

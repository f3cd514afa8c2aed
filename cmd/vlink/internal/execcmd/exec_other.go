//go:build !linux

package execcmd

import (
	"context"
	"errors"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/vlink"
)

// execProgram: the preload shim is Linux-only.
func execProgram(ctx context.Context, e *base.Env, o *execOptions, cfg *vlink.Config) (int, error) {
	return ExitExecFailed, errors.New("vlink exec is Linux-only: the preload shim and its agent need Linux " +
		"(use vlink tunnel to carry a program's connections elsewhere)")
}

// buildShimTo: the preload shim is Linux-only.
func buildShimTo(file string) error {
	return errors.New("vlink exec is Linux-only: there is no shim to build here")
}

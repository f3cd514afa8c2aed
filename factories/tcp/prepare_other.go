//go:build !linux

package tcp

import (
	"errors"
	"syscall"
)

// PrepareSocket is Linux's: elsewhere no event loop dials on its own.
func (f *Factory) PrepareSocket(syscall.RawConn) error { return errors.ErrUnsupported }

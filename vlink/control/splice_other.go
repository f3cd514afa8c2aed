//go:build !unix

package control

import (
	"errors"
	"syscall"
)

const spliceSupported = false

func reusePort(string, string, syscall.RawConn) error {
	return errors.New("control: splicing needs SO_REUSEPORT")
}

//go:build !unix

package tcp

import (
	"errors"
	"net/netip"
	"syscall"
)

// Port ranges need the socket bound between its creation and connect,
// which is written for unix sockets only.
const canBindPorts = false

func (p *portPicker) bind(syscall.RawConn, string, netip.Addr) error { return errors.ErrUnsupported }

func isAddrInUse(error) bool    { return false }
func isAddrNotAvail(error) bool { return false }

//go:build !linux

package vlink

import (
	"net"
	"time"
)

// waitWhole does not watch here: a parked connection waits for the sweep.
func waitWhole(net.Conn, time.Duration) bool { return false }

//go:build !linux

package evloop

import "net"

// A Loop serves a listener's connections on one goroutine (Linux only).
type Loop struct{ net.Listener }

// Listen returns ErrUnsupported outside Linux.
func Listen(*net.TCPListener, Config, Handler) (*Loop, error) { return nil, ErrUnsupported }

// Abort resets every connection in progress.
func (*Loop) Abort() {}

// Done is closed once the loop is closed and empty.
func (*Loop) Done() <-chan struct{} { return nil }

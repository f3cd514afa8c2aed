//go:build !unix

package vlink

import "net"

// peekQueued reports no bytes where the socket cannot be peeked at: a
// parked connection then waits for a free slot.
func peekQueued(net.Conn, []byte) int { return 0 }

//go:build !unix

package vlink

import "net"

// peekQueued reports no bytes where the socket cannot be peeked at: a
// parked connection then waits for a free slot.
func peekQueued(net.Conn, []byte) int { return 0 }

// peekFirst cannot peek here: the caller reads instead.
func peekFirst(net.Conn) (b byte, n int, ok bool, err error) { return 0, 0, false, nil }

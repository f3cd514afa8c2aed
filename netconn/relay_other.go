//go:build !unix

package netconn

import "net"

// pollCopy needs non-blocking reads on the raw socket, written for Unix
// only; elsewhere relays copy through a buffer held while Read blocks.
func pollCopy(dst, src net.Conn) (int64, error, bool) { return 0, nil, false }

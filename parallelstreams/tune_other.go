//go:build !linux

package parallelstreams

import "net"

// tune does nothing where TCP_NOTSENT_LOWAT is not available.
func tune(net.Conn) {}

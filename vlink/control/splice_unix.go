//go:build unix

package control

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const spliceSupported = true

// reusePort lets a splice's listener and its connecting socket share a
// port: the connection they make has that port at our end.
func reusePort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

//go:build unix

package tcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

const canBindPorts = true

// bind binds the socket behind rc to a free port of the picker's range,
// from local if it is valid. It runs as a net.Dialer Control function,
// before the net package connects the socket.
func (p *portPicker) bind(rc syscall.RawConn, network string, local netip.Addr) error {
	var err error
	cerr := rc.Control(func(fd uintptr) {
		// Ports of earlier connections linger in TIME_WAIT for a minute;
		// SO_REUSEADDR lets this socket bind them again (listening
		// ports stay off limits), so a small range is not used up by a
		// few short connections.
		if err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			err = os.NewSyscallError("setsockopt", err)
			return
		}
		for {
			port, ok := p.next()
			if !ok {
				err = fmt.Errorf("%w %s", ErrNoFreePort, p.r)
				return
			}
			var sa unix.Sockaddr
			if network == "tcp4" {
				sa4 := &unix.SockaddrInet4{Port: port}
				if local.IsValid() {
					sa4.Addr = local.As4()
				}
				sa = sa4
			} else {
				sa6 := &unix.SockaddrInet6{Port: port}
				if local.IsValid() {
					sa6.Addr = local.As16()
					sa6.ZoneId = zoneID(local.Zone())
				}
				sa = sa6
			}
			err = unix.Bind(int(fd), sa)
			if err != unix.EADDRINUSE {
				if err != nil {
					err = os.NewSyscallError("bind", err)
				}
				return
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

func zoneID(zone string) uint32 {
	if zone == "" {
		return 0
	}
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	n, _ := strconv.ParseUint(zone, 10, 32)
	return uint32(n)
}

func isAddrInUse(err error) bool    { return errors.Is(err, syscall.EADDRINUSE) }
func isAddrNotAvail(err error) bool { return errors.Is(err, syscall.EADDRNOTAVAIL) }

package tcp

import (
	"net"
	"net/netip"
)

// LocalAddrs returns the host's addresses a peer could reach it at, for
// address exchange: the unicast addresses of the interfaces that are up.
// Link-local addresses (with their interface as zone) are returned only if
// there is nothing else, and loopback ones only if there is not even that.
// IPv4-mapped addresses are unmapped.
func LocalAddrs() ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var routable, linkLocal, loopback []netip.Addr
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			switch {
			case ip.IsLoopback():
				loopback = append(loopback, ip)
			case ip.IsLinkLocalUnicast():
				if ip.Is6() {
					ip = ip.WithZone(ifi.Name)
				}
				linkLocal = append(linkLocal, ip)
			case ip.IsGlobalUnicast(): // private ranges included
				routable = append(routable, ip)
			}
		}
	}
	switch {
	case len(routable) > 0:
		return routable, nil
	case len(linkLocal) > 0:
		return linkLocal, nil
	}
	return loopback, nil
}

// Package proxyproto writes the header of the PROXY protocol, version 2
// (haproxy's proxy-protocol.txt, section 2.2), which tells a server that
// accepts it (nginx "listen ... proxy_protocol", haproxy "accept-proxy")
// where a forwarded TCP connection really came from. vlink serve sends it
// only to the targets it is told to: a server that does not expect the
// header takes it for the client's first bytes.
package proxyproto

import (
	"encoding/binary"
	"net/netip"
)

// Signature opens every version 2 header.
const Signature = "\r\n\r\n\x00\r\nQUIT\n"

const (
	verCmdProxy = 0x21 // version 2, PROXY: the addresses follow
	famTCP4     = 0x11 // AF_INET, STREAM
	famTCP6     = 0x21 // AF_INET6, STREAM
	fixedSize   = len(Signature) + 4
)

// Header returns the header for a TCP connection from src to dst. When
// one address is IPv4 and the other IPv6, both are written as IPv6 (the
// IPv4 one mapped), since the header has a single family.
func Header(src, dst netip.AddrPort) []byte {
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	fam, alen := byte(famTCP4), 12
	if !s.Is4() || !d.Is4() {
		fam, alen = famTCP6, 36
		s, d = netip.AddrFrom16(s.As16()), netip.AddrFrom16(d.As16())
	}
	b := make([]byte, 0, fixedSize+alen)
	b = append(b, Signature...)
	b = append(b, verCmdProxy, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(alen))
	b = append(b, s.AsSlice()...)
	b = append(b, d.AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

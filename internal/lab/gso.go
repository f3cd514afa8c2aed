package lab

import (
	"encoding/binary"
	"errors"
)

// The delay line reads and writes its TUN devices with a virtio-net
// header in front of each packet (IFF_VNET_HDR) and TCP segmentation
// offload on, so the kernel hands it TCP "super-packets" of up to 64 KiB
// that stand for many wire-sized segments. Forwarding those whole is what
// makes the delay line fast (one read and one write per ~44 segments);
// dropping one segment out of one, for loss, is what this file does.

// Offsets and values of struct virtio_net_hdr (10 bytes, native endian:
// tun uses the host's byte order unless told otherwise).
const (
	vnetHdrLen = 10

	vnetFlagsOff     = 0
	vnetGSOTypeOff   = 1
	vnetHdrLenOff    = 2
	vnetGSOSizeOff   = 4
	vnetCsumStartOff = 6
	vnetCsumOffOff   = 8

	vnetFlagNeedsCsum = 1

	gsoNone  = 0
	gsoTCPv4 = 1
	gsoTCPv6 = 4
	gsoECN   = 0x80

	tcpFlagFIN = 0x01
	tcpFlagPSH = 0x08
	tcpFlagCWR = 0x80

	protoTCP = 6

	// maxPacket is the largest packet a TUN read returns: the virtio
	// header and an IP packet of at most 64 KiB.
	maxPacket = vnetHdrLen + 65535
)

var errNotGSO = errors.New("not a TCP segmentation-offload packet")

// A gsoPacket is a parsed TCP super-packet: headers up to the end of the
// TCP header, then payload cut in segments of segSize bytes.
type gsoPacket struct {
	pkt     []byte // vnet header and IP packet
	ipv6    bool
	l4      int // offset of the TCP header in the IP packet
	hdrLen  int // IP and TCP headers
	segSize int
	payload int // bytes after the headers
}

// segments returns how many wire packets a TUN packet stands for: 1 for
// anything but a well-formed TCP super-packet.
func segments(pkt []byte) int {
	g, err := parseGSO(pkt)
	if err != nil {
		return 1
	}
	return g.segments()
}

func (g *gsoPacket) segments() int {
	if g.payload == 0 {
		return 1
	}
	return (g.payload + g.segSize - 1) / g.segSize
}

// parseGSO checks that pkt is a TCP super-packet whose headers can be
// rewritten: a GSO type the delay line enabled, an IP header that agrees
// with it and with the packet's length, a TCP header inside the packet.
func parseGSO(pkt []byte) (gsoPacket, error) {
	if len(pkt) < vnetHdrLen+20 || len(pkt) > maxPacket {
		return gsoPacket{}, errNotGSO
	}
	ne := binary.NativeEndian
	typ := pkt[vnetGSOTypeOff] &^ gsoECN
	g := gsoPacket{pkt: pkt, segSize: int(ne.Uint16(pkt[vnetGSOSizeOff:]))}
	ip := pkt[vnetHdrLen:]
	switch {
	case typ == gsoTCPv4 && ip[0]>>4 == 4:
		g.l4 = int(ip[0]&0x0f) * 4
		if g.l4 < 20 || ip[9] != protoTCP || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
			return gsoPacket{}, errNotGSO
		}
		if ip[6]&0x3f != 0 || ip[7] != 0 { // a fragment (MF or an offset)
			return gsoPacket{}, errNotGSO
		}
	case typ == gsoTCPv6 && ip[0]>>4 == 6:
		// Extension headers: trust the kernel's csum_start, which points
		// at the TCP header, and only accept a TCP next header directly.
		g.ipv6, g.l4 = true, 40
		if len(ip) < 40 || ip[6] != protoTCP || int(binary.BigEndian.Uint16(ip[4:]))+40 != len(ip) {
			return gsoPacket{}, errNotGSO
		}
	default:
		return gsoPacket{}, errNotGSO
	}
	if cs := int(ne.Uint16(pkt[vnetCsumStartOff:])); pkt[vnetFlagsOff]&vnetFlagNeedsCsum != 0 && cs != g.l4 {
		return gsoPacket{}, errNotGSO
	}
	if len(ip) < g.l4+20 {
		return gsoPacket{}, errNotGSO
	}
	tcpLen := int(ip[g.l4+12]>>4) * 4
	g.hdrLen = g.l4 + tcpLen
	if tcpLen < 20 || len(ip) < g.hdrLen || g.segSize < 1 {
		return gsoPacket{}, errNotGSO
	}
	g.payload = len(ip) - g.hdrLen
	return g, nil
}

// appendSegments appends to dst a packet that carries segments [i, j) of
// g, with the headers Linux's own TCP segmentation would give them: IP
// length and (IPv4) identification and header checksum, TCP sequence
// number, FIN and PSH only on the last segment, CWR only on the first,
// and a partial checksum (the pseudo-header sum) for the kernel to
// complete. A single segment goes out as an ordinary packet.
func (g *gsoPacket) appendSegments(dst []byte, i, j int) []byte {
	n := g.segments()
	if i < 0 || j > n || i >= j {
		panic("lab: segment range out of bounds")
	}
	from := i * g.segSize
	to := min(j*g.segSize, g.payload)
	start := len(dst)
	dst = append(dst, g.pkt[:vnetHdrLen+g.hdrLen]...)
	dst = append(dst, g.pkt[vnetHdrLen+g.hdrLen+from:vnetHdrLen+g.hdrLen+to]...)
	out := dst[start:]
	ip := out[vnetHdrLen:]
	ne := binary.NativeEndian
	out[vnetFlagsOff] |= vnetFlagNeedsCsum
	ne.PutUint16(out[vnetHdrLenOff:], uint16(g.hdrLen))
	ne.PutUint16(out[vnetCsumStartOff:], uint16(g.l4))
	ne.PutUint16(out[vnetCsumOffOff:], 16)
	if j-i == 1 {
		out[vnetGSOTypeOff] = gsoNone
		ne.PutUint16(out[vnetGSOSizeOff:], 0)
	}
	be := binary.BigEndian
	if g.ipv6 {
		be.PutUint16(ip[4:], uint16(len(ip)-40))
	} else {
		be.PutUint16(ip[2:], uint16(len(ip)))
		be.PutUint16(ip[4:], be.Uint16(ip[4:])+uint16(i))
		ip[10], ip[11] = 0, 0
		be.PutUint16(ip[10:], ^fold(sum(ip[:g.l4], 0)))
	}
	tcp := ip[g.l4:]
	be.PutUint32(tcp[4:], be.Uint32(tcp[4:])+uint32(from))
	if j < n {
		tcp[13] &^= tcpFlagFIN | tcpFlagPSH
	}
	if i > 0 {
		tcp[13] &^= tcpFlagCWR
	}
	// The partial checksum is the folded, uncomplemented sum of the
	// pseudo-header; the kernel adds the segment's bytes.
	var ps uint32
	if g.ipv6 {
		ps = sum(ip[8:40], 0)
	} else {
		ps = sum(ip[12:20], 0)
	}
	ps += protoTCP + uint32(len(tcp))
	be.PutUint16(tcp[16:], fold(ps))
	return dst
}

// sum adds b as big-endian 16-bit words to s (RFC 1071).
func sum(b []byte, s uint32) uint32 {
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

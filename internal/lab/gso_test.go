package lab

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// superPacket builds what a TUN read with TSO returns: a virtio-net
// header and a TCP packet with payload bytes, to be cut in segments of
// mss bytes, with a partial checksum as the kernel leaves it.
func superPacket(ipv6 bool, payload []byte, mss int, flags byte) []byte {
	ne, be := binary.NativeEndian, binary.BigEndian
	l4 := 20
	if ipv6 {
		l4 = 40
	}
	tcpLen := 32 // with options (timestamps)
	pkt := make([]byte, vnetHdrLen+l4+tcpLen+len(payload))
	ip := pkt[vnetHdrLen:]
	pkt[vnetFlagsOff] = vnetFlagNeedsCsum
	pkt[vnetGSOTypeOff] = gsoTCPv4
	if ipv6 {
		pkt[vnetGSOTypeOff] = gsoTCPv6
	}
	ne.PutUint16(pkt[vnetHdrLenOff:], uint16(l4+tcpLen))
	ne.PutUint16(pkt[vnetGSOSizeOff:], uint16(mss))
	ne.PutUint16(pkt[vnetCsumStartOff:], uint16(l4))
	ne.PutUint16(pkt[vnetCsumOffOff:], 16)
	if ipv6 {
		ip[0] = 0x60
		be.PutUint16(ip[4:], uint16(len(ip)-40))
		ip[6], ip[7] = protoTCP, 64
		copy(ip[8:], []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
		copy(ip[24:], []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2})
	} else {
		ip[0] = 0x45
		be.PutUint16(ip[2:], uint16(len(ip)))
		be.PutUint16(ip[4:], 0x1234)
		ip[6] = 0x40 // DF
		ip[8], ip[9] = 64, protoTCP
		copy(ip[12:], []byte{10, 77, 0, 1, 10, 77, 0, 2})
		be.PutUint16(ip[10:], ^fold(sum(ip[:20], 0)))
	}
	tcp := ip[l4:]
	be.PutUint16(tcp[0:], 40000)
	be.PutUint16(tcp[2:], 5201)
	be.PutUint32(tcp[4:], 0xfffff000) // wraps during the packet
	be.PutUint32(tcp[8:], 777)
	tcp[12] = byte(tcpLen/4) << 4
	tcp[13] = 0x10 | flags // ACK
	be.PutUint16(tcp[14:], 512)
	for i := 20; i < tcpLen; i++ {
		tcp[i] = 1 // NOPs
	}
	copy(tcp[tcpLen:], payload)
	var ps uint32
	if ipv6 {
		ps = sum(ip[8:40], 0)
	} else {
		ps = sum(ip[12:20], 0)
	}
	be.PutUint16(tcp[16:], fold(ps+protoTCP+uint32(len(tcp))))
	return pkt
}

// checkSegments checks a packet made by appendSegments(i, j) as the
// receiving kernel would see it.
func checkSegments(t *testing.T, orig, out []byte, ipv6 bool, payload []byte, mss, i, j, n int) {
	t.Helper()
	ne, be := binary.NativeEndian, binary.BigEndian
	ip := out[vnetHdrLen:]
	l4 := 20
	if ipv6 {
		l4 = 40
	}
	tcp := ip[l4:]
	tcpLen := int(tcp[12]>>4) * 4
	from, to := i*mss, min(j*mss, len(payload))
	if !bytes.Equal(tcp[tcpLen:], payload[from:to]) {
		t.Fatalf("[%d,%d): payload %d bytes, want bytes %d to %d", i, j, len(tcp[tcpLen:]), from, to)
	}
	if ipv6 {
		if int(be.Uint16(ip[4:])) != len(ip)-40 {
			t.Fatalf("[%d,%d): IPv6 payload length %d, want %d", i, j, be.Uint16(ip[4:]), len(ip)-40)
		}
	} else {
		if int(be.Uint16(ip[2:])) != len(ip) {
			t.Fatalf("[%d,%d): IPv4 total length %d, want %d", i, j, be.Uint16(ip[2:]), len(ip))
		}
		if fold(sum(ip[:20], 0)) != 0xffff {
			t.Fatalf("[%d,%d): bad IPv4 header checksum", i, j)
		}
		if id := be.Uint16(ip[4:]); id != 0x1234+uint16(i) {
			t.Fatalf("[%d,%d): IP id %#x, want %#x", i, j, id, 0x1234+i)
		}
	}
	if seq := be.Uint32(tcp[4:]); seq != 0xfffff000+uint32(from) {
		t.Fatalf("[%d,%d): seq %#x, want %#x", i, j, seq, 0xfffff000+uint32(from))
	}
	origFlags := orig[vnetHdrLen+l4+13]
	wantFlags := origFlags
	if j < n {
		wantFlags &^= tcpFlagFIN | tcpFlagPSH
	}
	if i > 0 {
		wantFlags &^= tcpFlagCWR
	}
	if tcp[13] != wantFlags {
		t.Fatalf("[%d,%d): TCP flags %#x, want %#x", i, j, tcp[13], wantFlags)
	}
	single := j-i == 1
	if (out[vnetGSOTypeOff] == gsoNone) != single || single != (ne.Uint16(out[vnetGSOSizeOff:]) == 0) {
		t.Fatalf("[%d,%d): gso type %d size %d", i, j, out[vnetGSOTypeOff], ne.Uint16(out[vnetGSOSizeOff:]))
	}
	if int(ne.Uint16(out[vnetCsumStartOff:])) != l4 || ne.Uint16(out[vnetCsumOffOff:]) != 16 || out[vnetFlagsOff]&vnetFlagNeedsCsum == 0 {
		t.Fatalf("[%d,%d): checksum offload fields %x", i, j, out[:vnetHdrLen])
	}
	// Complete the checksum as the kernel does (fold the bytes from
	// csum_start, the partial sum included), then verify it the way a
	// receiver does.
	seg := append([]byte(nil), tcp...)
	be.PutUint16(seg[16:], ^fold(sum(seg, 0)))
	var ps uint32
	if ipv6 {
		ps = sum(ip[8:40], 0)
	} else {
		ps = sum(ip[12:20], 0)
	}
	if fold(sum(seg, ps+protoTCP+uint32(len(seg)))) != 0xffff {
		t.Fatalf("[%d,%d): TCP checksum does not verify", i, j)
	}
}

func TestSplitSegments(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		for _, size := range []int{1, 1448, 1449, 10 * 1448, 44*1448 + 7} {
			payload := make([]byte, size)
			for k := range payload {
				payload[k] = byte(k * 7)
			}
			const mss = 1448
			pkt := superPacket(ipv6, payload, mss, tcpFlagFIN|tcpFlagPSH|tcpFlagCWR)
			n := (size + mss - 1) / mss
			if got := segments(pkt); got != n {
				t.Fatalf("v6=%v size %d: %d segments, want %d", ipv6, size, got, n)
			}
			g, err := parseGSO(pkt)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < n; i++ {
				for j := i + 1; j <= n; j++ {
					out := g.appendSegments([]byte("prefix"), i, j)
					if string(out[:6]) != "prefix" {
						t.Fatal("appendSegments overwrote dst")
					}
					checkSegments(t, pkt, out[6:], ipv6, payload, mss, i, j, n)
				}
			}
			if !bytes.Equal(pkt, superPacket(ipv6, payload, mss, tcpFlagFIN|tcpFlagPSH|tcpFlagCWR)) {
				t.Fatal("appendSegments changed the original")
			}
		}
	}
}

func TestParseGSORejects(t *testing.T) {
	good := superPacket(false, make([]byte, 5000), 1448, 0)
	mutate := func(f func(p []byte)) []byte {
		p := append([]byte(nil), good...)
		f(p)
		return p
	}
	be := binary.BigEndian
	for name, p := range map[string][]byte{
		"no gso":          mutate(func(p []byte) { p[vnetGSOTypeOff] = gsoNone }),
		"udp gso":         mutate(func(p []byte) { p[vnetGSOTypeOff] = 5 }),
		"v6 type on v4":   mutate(func(p []byte) { p[vnetGSOTypeOff] = gsoTCPv6 }),
		"short":           good[:vnetHdrLen+30],
		"length mismatch": mutate(func(p []byte) { be.PutUint16(p[vnetHdrLen+2:], 100) }),
		"fragment":        mutate(func(p []byte) { p[vnetHdrLen+6] |= 0x20 }),
		"not tcp":         mutate(func(p []byte) { p[vnetHdrLen+9] = 17 }),
		"zero mss":        mutate(func(p []byte) { binary.NativeEndian.PutUint16(p[vnetGSOSizeOff:], 0) }),
		"csum start off":  mutate(func(p []byte) { binary.NativeEndian.PutUint16(p[vnetCsumStartOff:], 24) }),
		"tcp header long": func() []byte {
			p := superPacket(false, make([]byte, 10), 1448, 0)
			p[vnetHdrLen+20+12] = 0xf0 // 60 bytes of header in 42
			return p
		}(),
		"ihl short": mutate(func(p []byte) { p[vnetHdrLen] = 0x44 }),
	} {
		if _, err := parseGSO(p); err == nil {
			t.Errorf("%s: parsed", name)
		}
		if segments(p) != 1 {
			t.Errorf("%s: %d segments, want 1", name, segments(p))
		}
	}
}

// FuzzSplitSegments: no packet from a TUN device, however malformed,
// makes the splitter panic or produce a packet whose lengths disagree.
func FuzzSplitSegments(f *testing.F) {
	// Small seeds (a small MSS keeps several segments): the fuzzer
	// minimizes every new input, which is slow for large ones.
	f.Add(superPacket(false, make([]byte, 50), 16, tcpFlagFIN), uint8(1), uint8(3))
	f.Add(superPacket(true, make([]byte, 30), 8, tcpFlagCWR), uint8(0), uint8(1))
	f.Add(superPacket(false, make([]byte, 1), 536, 0), uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, pkt []byte, a, b uint8) {
		n := segments(pkt)
		g, err := parseGSO(pkt)
		if err != nil {
			if n != 1 {
				t.Fatalf("unparsable packet counts %d segments", n)
			}
			return
		}
		i, j := int(a)%n, int(b)%n+1
		if i >= j {
			i, j = j-1, i+1
		}
		out := g.appendSegments(nil, i, j)
		if len(out) < vnetHdrLen+g.hdrLen || len(out) > len(pkt) {
			t.Fatalf("split [%d,%d) of %d: %d bytes from %d", i, j, n, len(out), len(pkt))
		}
		if out2, err := parseGSO(out); j-i > 1 && (err != nil || out2.segments() != j-i) {
			t.Fatalf("split [%d,%d) does not parse as %d segments: %v", i, j, j-i, err)
		}
	})
}

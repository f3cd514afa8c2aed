package proxyproto

import (
	"encoding/hex"
	"net/netip"
	"testing"
)

// The expected bytes are spelled out from the specification's layout
// (section 2.2): signature, 0x21, family, length, addresses, ports.
func TestHeader(t *testing.T) {
	sig := hex.EncodeToString([]byte(Signature))
	for _, tc := range []struct {
		name, src, dst, want string
	}{
		{"ipv4", "192.0.2.1:5555", "10.0.0.2:80", sig + "2111000c" + "c0000201" + "0a000002" + "15b3" + "0050"},
		{"ipv6", "[2001:db8::1]:1", "[::1]:443", sig + "21210024" + "20010db8000000000000000000000001" + "00000000000000000000000000000001" + "0001" + "01bb"},
		{"mixed families map ipv4", "192.0.2.1:2", "[::1]:3", sig + "21210024" + "00000000000000000000ffffc0000201" + "00000000000000000000000000000001" + "0002" + "0003"},
		{"ipv4-mapped ipv6 stays ipv4", "[::ffff:192.0.2.1]:2", "10.0.0.2:3", sig + "2111000c" + "c0000201" + "0a000002" + "0002" + "0003"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hex.EncodeToString(Header(netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst)))
			if got != tc.want {
				t.Fatalf("Header(%s, %s)\n got %s\nwant %s", tc.src, tc.dst, got, tc.want)
			}
		})
	}
}

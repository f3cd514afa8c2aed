package base

import (
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
)

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		bps  float64
		want string
	}{{0, "0 bit/s"}, {999, "999 bit/s"}, {1500, "1.5 kbit/s"}, {2.5e6, "2.5 Mbit/s"}, {9.61e9, "9.61 Gbit/s"}} {
		if got := FormatRate(tc.bps); got != tc.want {
			t.Errorf("formatRate(%v) = %q, want %q", tc.bps, got, tc.want)
		}
	}
}

// TestCheckKeyCarried checks which stacks may take --key-file: those
// that send a hello (a layer to mirror, a gateway), and any stack of a
// node, whose key may derive from it.
func TestCheckKeyCarried(t *testing.T) {
	node := &NodeOptions{name: "a", relays: "127.0.0.1:1"}
	for _, tc := range []struct {
		stack, via string
		node       *NodeOptions
		ok         bool
	}{
		{"tcp", "", &NodeOptions{}, false},
		{"quic", "", &NodeOptions{}, false},
		{"socks5:addr=proxy.example:1080+tcp", "", &NodeOptions{}, false},
		{"zstd+quic", "", &NodeOptions{}, true},
		{"identity+shm", "", &NodeOptions{}, true},
		{"tcp", "gw.example:7000", &NodeOptions{}, true},
		{"tcp", "", node, true},
		{"relay", "", node, true},
	} {
		s, err := vlink.Parse(tc.stack)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckKeyCarried(tc.stack, s, tc.via, tc.node)
		if (err == nil) != tc.ok {
			t.Errorf("--stack %s, via %q, node %v: %v, want ok %v", tc.stack, tc.via, tc.node.Given(), err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--stack zstd+"+tc.stack) {
			t.Errorf("--stack %s: %v does not say what to write instead", tc.stack, err)
		}
	}
}

package dial

import (
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

func TestClientAllowed(t *testing.T) {
	_, prefixes, _, err := (&socksOptions{allowFrom: base.ListFlag{"10.1.0.0/16", "fd00::1"}, stack: "tcp",
		handshakeTimeout: time.Second, dialTimeout: time.Second}).setup()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:5", true}, {"[::1]:5", true}, {"127.9.9.9:5", true},
		{"10.1.200.3:5", true}, {"10.2.0.1:5", false}, {"192.168.1.1:5", false},
		{"[fd00::1]:5", true}, {"[fd00::2]:5", false}, {"[::ffff:10.1.0.1]:5", true},
	} {
		a, _ := net.ResolveTCPAddr("tcp", tc.addr)
		if got := clientAllowed(a, prefixes); got != tc.want {
			t.Errorf("client %s allowed = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

package vlink

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
)

// The congestion control of a dialer's tcp layer (tcp:cc=...) rides its
// hello: the listener sets it on its side of the connection before it
// accepts, so the bytes it sends back use it too. reno is built into
// every kernel, and the default of none.
func TestHelloCongestionControl(t *testing.T) {
	def, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	type seen struct{ hello, socket string }
	got := make(chan seen, 4)
	testnet.Serve(t, l, func(c net.Conn) {
		vc := c.(*Conn)
		// test-xor's conn hides what is below it from netconn.TCPBelow.
		cc, err := netconn.CongestionControl(vc.UnwrapConn().(*xorConn).Conn.(*net.TCPConn))
		if err != nil {
			cc = err.Error()
		}
		got <- seen{vc.Hello().CongestionControl, cc}
		c.Close()
	})
	for _, tc := range []struct {
		stack string
		want  seen
	}{
		{"test-xor+tcp:cc=reno", seen{"reno", "reno"}},
		{"test-xor+tcp", seen{"", strings.TrimSpace(string(def))}},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			c, err := (&Dialer{Stack: MustParse(tc.stack)}).Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if g := <-got; g != tc.want {
				t.Errorf("the listener's side: hello %q, socket %q; want %q, %q", g.hello, g.socket, tc.want.hello, tc.want.socket)
			}
		})
	}
}

// A hello asking for a congestion control the listener's kernel does not
// offer is refused with CodeParam and a reason naming what it offers.
func TestHelloCongestionControlRefused(t *testing.T) {
	l, _ := echoListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &helloDialer{next: &net.Dialer{}, peer: l.Addr().String(), stack: "test-xor", cc: "nosuchcc"}
	c, err := d.DialContext(ctx, "tcp", l.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("accepted")
	}
	var re *RefusedError
	if !errors.As(err, &re) || re.Code != CodeParam || !strings.Contains(re.Reason, "nosuchcc") || !strings.Contains(re.Reason, "this kernel offers: ") {
		t.Fatalf("%v: want a refusal with CodeParam naming nosuchcc and what the kernel offers", err)
	}
}

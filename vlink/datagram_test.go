package vlink_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// datagramGateway is a gateway that relays datagram sessions to the
// targets its policy allows, as vlink serve --allow-udp does.
func datagramGateway(t *testing.T, p vlink.Policy) string {
	t.Helper()
	return datagramGatewayOn(t, vlink.ListenConfig{Policy: p}, nil)
}

// datagramGatewayOn is datagramGateway listening as lc says; hellos, if
// not nil, gets the hello of each session.
func datagramGatewayOn(t *testing.T, lc vlink.ListenConfig, hellos chan<- *vlink.Hello) string {
	t.Helper()
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.AcceptVLink()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h := c.Hello()
				if h == nil || !h.Datagram {
					t.Errorf("the gateway got a stream: %+v", h)
					return
				}
				if hellos != nil {
					hellos <- h
				}
				u, err := net.Dial("udp", h.Target)
				if err != nil {
					t.Error(err)
					return
				}
				defer u.Close()
				dgram.Relay(vlink.DatagramConn(c, nil), u, 0)
			}()
		}
	}()
	return l.Addr().String()
}

var loopbackDatagrams = []selector.Rule{{Host: "127.0.0.1", Ports: "*", Action: selector.Direct}}

func TestDatagrams(t *testing.T) {
	echo := testnet.UDPEcho(t).String()
	for _, tc := range []struct {
		stack string
		key   []byte
	}{
		{"tcp", nil},
		{"zstd", nil},
		{"noise", key},
		{"zstd+mux", nil},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			gw := datagramGateway(t, vlink.Policy{Key: tc.key, Datagrams: loopbackDatagrams})
			d := vlink.Dialer{Stack: vlink.MustParse(tc.stack), Via: gw, Key: tc.key}
			defer d.Close()
			c, err := d.Dial("udp", echo)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.RemoteAddr().String() != echo || c.RemoteAddr().Network() != "udp" {
				t.Errorf("RemoteAddr %s %v, want udp %s", c.RemoteAddr().Network(), c.RemoteAddr(), echo)
			}
			echoesWhole(t, c, 0, 1, 512, 1472, 60000)
		})
	}
}

// echoesWhole sends datagrams of the sizes given on c, whose far end
// echoes them, and checks that each comes back whole.
func echoesWhole(t *testing.T, c net.Conn, sizes ...int) {
	t.Helper()
	buf := make([]byte, dgram.MaxDatagram)
	for i, n := range sizes {
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(i + j*7)
		}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := c.Read(buf)
		if err != nil {
			t.Fatalf("datagram of %d bytes: %v", n, err)
		}
		if sha256.Sum256(buf[:got]) != sha256.Sum256(msg) {
			t.Fatalf("datagram of %d bytes came back as %d other bytes", n, got)
		}
	}
}

// A datagram to a closed port is ECONNREFUSED on the next Read, as on a
// connected UDP socket of one's own.
func TestDatagramRefusedPort(t *testing.T) {
	pc, _ := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	closed := pc.LocalAddr().String()
	pc.Close()
	gw := datagramGateway(t, vlink.Policy{Datagrams: loopbackDatagrams})
	d := vlink.Dialer{Stack: vlink.MustParse("zstd"), Via: gw}
	c, err := d.Dial("udp", closed)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("anyone?"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 16)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("read: %v, want ECONNREFUSED", err)
	}
}

func TestDatagramsNotAllowed(t *testing.T) {
	echo := testnet.UDPEcho(t).String()
	for _, tc := range []struct {
		name   string
		policy vlink.Policy
		want   string
	}{
		// Streams to a target do not let datagrams through.
		{"streams only", vlink.Policy{Targets: loopbackDatagrams}, "relays no datagrams"},
		{"another target", vlink.Policy{Datagrams: []selector.Rule{{Host: "10.0.0.0/8", Ports: "*", Action: selector.Direct}}}, "--allow-udp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := datagramGateway(t, tc.policy)
			d := vlink.Dialer{Stack: vlink.MustParse("zstd"), Via: gw}
			_, err := d.Dial("udp", echo)
			var re *vlink.RefusedError
			if !errors.As(err, &re) || re.Code != vlink.CodeTarget || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("dial: %v, want a target refusal saying %q", err, tc.want)
			}
		})
	}
}

func TestNoDatagrams(t *testing.T) {
	for _, tc := range []struct {
		name    string
		d       *vlink.Dialer
		address string
	}{
		{"stack without a gateway", &vlink.Dialer{Stack: vlink.MustParse("zstd")}, "127.0.0.1:53"},
		{"proxy factory", &vlink.Dialer{Stack: vlink.MustParse("socks5:addr=127.0.0.1:1")}, "127.0.0.1:53"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.d.Dial("udp", tc.address)
			if !errors.Is(err, vlink.ErrNoDatagrams) {
				t.Fatalf("dial: %v, want ErrNoDatagrams", err)
			}
		})
	}
	// A plain route is the kernel's UDP.
	c, err := (&vlink.Dialer{Stack: vlink.MustParse("tcp")}).Dial("udp", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*net.UDPConn); !ok {
		t.Fatalf("a plain route gave a %T, want the kernel's *net.UDPConn", c)
	}
}

func TestAllowsDatagrams(t *testing.T) {
	both := vlink.Policy{Targets: loopbackDatagrams}
	udp := vlink.Policy{Datagrams: loopbackDatagrams}
	for _, tc := range []struct {
		name            string
		p               vlink.Policy
		streams, dgrams bool
	}{
		{"streams only", both, true, false},
		{"datagrams only", udp, false, true},
		{"none", vlink.Policy{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.AllowsTarget("127.0.0.1:53"); (err == nil) != tc.streams {
				t.Errorf("AllowsTarget: %v, want allowed %v", err, tc.streams)
			}
			if err := tc.p.AllowsDatagrams("127.0.0.1:53"); (err == nil) != tc.dgrams {
				t.Errorf("AllowsDatagrams: %v, want allowed %v", err, tc.dgrams)
			}
			if err := tc.p.AllowsDatagrams("10.0.0.1:53"); err == nil {
				t.Error("AllowsDatagrams of a target no rule names: allowed")
			}
		})
	}
}

package tcp

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func getsockopt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatalf("getsockopt(%d, %d): %v", level, opt, gerr)
	}
	return v
}

// TestSocketOptions reads the options back from the kernel on both the
// dialed and the accepted socket.
func TestSocketOptions(t *testing.T) {
	def, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		args      fakeArgs
		nodelay   bool
		keepalive time.Duration // 0: off
		cc        string        // "": the system's default
	}{
		{"defaults", fakeArgs{}, true, DefaultKeepAlive, ""},
		{"nagle", fakeArgs{"nodelay": "false"}, false, DefaultKeepAlive, ""},
		{"keepalive-off", fakeArgs{"keepalive": "0s"}, true, 0, ""},
		{"keepalive-90s", fakeArgs{"keepalive": "90s"}, true, 90 * time.Second, ""},
		{"port-range", fakeArgs{"ports": freeRange(8).String(), "nodelay": "false", "keepalive": "1m"}, false, time.Minute, ""},
		// reno is built into every kernel, and the default of none.
		{"cc", fakeArgs{"cc": "reno"}, true, DefaultKeepAlive, "reno"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustFactory(t, tt.args)
			ln, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, s := dialAccept(t, f, "tcp", ln)
			// PrepareSocket (an event loop's dials) on a socket the net
			// package dialed with no keep-alives must set the same.
			bare, err := (&net.Dialer{KeepAlive: -1}).Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer bare.Close()
			rc, err := bare.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			if err := f.PrepareSocket(rc); err != nil {
				t.Fatalf("PrepareSocket: %v", err)
			}
			for side, conn := range map[string]net.Conn{"dialed": c, "accepted": s, "prepared": bare} {
				cc := tt.cc
				if cc == "" {
					cc = strings.TrimSpace(string(def))
				}
				if got, err := netconn.CongestionControl(conn.(*net.TCPConn)); got != cc {
					t.Errorf("%s: TCP_CONGESTION %q (%v), want %q", side, got, err, cc)
				}
				if got := getsockopt(t, conn, unix.IPPROTO_TCP, unix.TCP_NODELAY) != 0; got != tt.nodelay {
					t.Errorf("%s: TCP_NODELAY %v, want %v", side, got, tt.nodelay)
				}
				ka := getsockopt(t, conn, unix.SOL_SOCKET, unix.SO_KEEPALIVE) != 0
				if ka != (tt.keepalive > 0) {
					t.Errorf("%s: SO_KEEPALIVE %v, want %v", side, ka, tt.keepalive > 0)
				}
				// Data in flight on a dead path fails the connection within
				// the keep-alives' bound too (0: the kernel's default).
				wantUT := int((tt.keepalive * (KeepAliveCount + 1)).Milliseconds())
				if got := getsockopt(t, conn, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT); got != wantUT {
					t.Errorf("%s: TCP_USER_TIMEOUT %dms, want %dms", side, got, wantUT)
				}
				if !ka {
					continue
				}
				want := int(tt.keepalive / time.Second)
				if got := getsockopt(t, conn, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE); got != want {
					t.Errorf("%s: TCP_KEEPIDLE %ds, want %ds", side, got, want)
				}
				if got := getsockopt(t, conn, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL); got != want {
					t.Errorf("%s: TCP_KEEPINTVL %ds, want %ds", side, got, want)
				}
				if got := getsockopt(t, conn, unix.IPPROTO_TCP, unix.TCP_KEEPCNT); got != KeepAliveCount {
					t.Errorf("%s: TCP_KEEPCNT %d, want %d", side, got, KeepAliveCount)
				}
			}
			if _, ok := tt.args["ports"]; ok {
				if getsockopt(t, c, unix.SOL_SOCKET, unix.SO_REUSEADDR) == 0 {
					t.Error("range-bound dial socket lacks SO_REUSEADDR")
				}
			}
		})
	}
}

// A congestion control the kernel does not offer fails the dial and the
// listen with an error that names those it does; a name that cannot be
// one is refused by New.
func TestCongestionControlRefused(t *testing.T) {
	f := mustFactory(t, fakeArgs{"cc": "nosuchcc"})
	_, err := f.DialContext(context.Background(), "tcp", "127.0.0.1:9", nil)
	if !errors.Is(err, netconn.ErrCongestionControl) || !strings.Contains(err.Error(), "this kernel offers: ") {
		t.Errorf("dial: %v, want ErrCongestionControl naming what the kernel offers", err)
	}
	if ln, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil); !errors.Is(err, netconn.ErrCongestionControl) {
		if err == nil {
			ln.Close()
		}
		t.Errorf("listen: %v, want ErrCongestionControl", err)
	}
	for _, bad := range []string{"b b", "x/y", "waytoolongforacc"} {
		if _, err := newFromArgs(fakeArgs{"cc": bad}); !errors.Is(err, layer.ErrBadParam) {
			t.Errorf("cc=%q: %v, want ErrBadParam", bad, err)
		}
	}
}

package preload

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// TestPlainFactory: the agent connects by itself only where the route is
// tcp alone, without a gateway, to an address of the program's family,
// with options PrepareSocket carries out.
func TestPlainFactory(t *testing.T) {
	for _, tc := range []struct {
		name, stack, via, target string
		fam                      uint8
		want                     bool
	}{
		{"tcp", "tcp", "", "192.0.2.1:80", 4, true},
		{"tcp options", "tcp:cc=reno,keepalive=7s", "", "192.0.2.1:80", 4, true},
		{"ipv6", "tcp", "", "[2001:db8::1]:80", 6, true},
		{"family differs", "tcp", "", "192.0.2.1:80", 6, false},
		{"via a gateway", "tcp", "127.0.0.1:1", "192.0.2.1:80", 4, false},
		{"a filter", "zstd", "", "192.0.2.1:80", 4, false},
		{"a port range", "tcp:ports=40000-40010", "", "192.0.2.1:80", 4, false},
		{"a source address", "tcp:local=127.0.0.1", "", "192.0.2.1:80", 4, false},
		{"a name", "tcp", "", "example.test:80", 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := vlink.Parse(tc.stack)
			if err != nil {
				t.Fatal(err)
			}
			d := decision{rule: selector.Rule{Action: selector.Stack, Stack: tc.stack, Via: tc.via}, stack: s}
			if f, _ := plainFactory(d, tc.target, tc.fam); (f != nil) != tc.want {
				t.Errorf("plainFactory = %v, want a factory: %v", f, tc.want)
			}
		})
	}
}

// TestDialPlain: the agent's own connect carries the stack's options, and
// fails as a connect does: refused, timed out, or cut short by the agent
// closing.
func TestDialPlain(t *testing.T) {
	f := tcp.PreparedLayer("tcp", map[string]string{"keepalive": "7s"}, netip.IPv4Unspecified())
	if f == nil {
		t.Fatal("no factory for tcp:keepalive=7s")
	}
	t.Run("connects", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fd, err := dialPlain(context.Background(), f, l.Addr().(*net.TCPAddr).AddrPort(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := unix.Write(fd, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if b := make([]byte, 1); func() error { _, err := c.Read(b); return err }() != nil || b[0] != 'x' {
			t.Errorf("the byte did not arrive")
		}
		for _, o := range []struct {
			name             string
			level, opt, want int
		}{
			{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 7},
			{"TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY, 1},
		} {
			if v, err := unix.GetsockoptInt(fd, o.level, o.opt); err != nil || v != o.want {
				t.Errorf("%s = %d (%v), want %d", o.name, v, err, o.want)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		to := l.Addr().(*net.TCPAddr).AddrPort()
		l.Close()
		_, err = dialPlain(context.Background(), f, to, 5*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) || errnoOf(err) != syscall.ECONNREFUSED {
			t.Errorf("err = %v, want ECONNREFUSED", err)
		}
	})
	full := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(testnet.UnansweredPort(t)))
	waits(t, func(ctx context.Context, timeout time.Duration) error {
		_, err := dialPlain(ctx, f, full, timeout)
		return err
	})
}

// waits checks that dial, a connect the agent makes itself to a peer that
// never answers, ends as the program's connect would at its timeout
// (ETIMEDOUT), and at once when the agent closes.
func waits(t *testing.T, dial func(ctx context.Context, timeout time.Duration) error) {
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		err := dial(context.Background(), 300*time.Millisecond)
		if !errors.Is(err, os.ErrDeadlineExceeded) || errnoOf(err) != syscall.ETIMEDOUT {
			t.Errorf("err = %v, want a timeout (ETIMEDOUT)", err)
		}
		if took := time.Since(start); took < 300*time.Millisecond || took > 3*time.Second {
			t.Errorf("took %v, the timeout is 300ms", took)
		}
	})
	t.Run("agent closing", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		err := dial(ctx, time.Minute)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("took %v after the cancel at 100ms", took)
		}
	})
}

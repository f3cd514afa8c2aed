package preload

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// TestGatewayFactory: the agent makes the gateway's hello itself only for
// tcp alone through a gateway given as an address of the program's
// family, with nothing to prove.
func TestGatewayFactory(t *testing.T) {
	for _, tc := range []struct {
		name, stack, via string
		fam              uint8
		cfg              vlink.Config
		member           bool
		want             bool
	}{
		{name: "tcp via a gateway", stack: "tcp", via: "127.0.0.1:7000", fam: 4, want: true},
		{name: "tcp options", stack: "tcp:cc=reno,keepalive=7s", via: "127.0.0.1:7000", fam: 4, want: true},
		{name: "ipv6", stack: "tcp", via: "[::1]:7000", fam: 6, want: true},
		{name: "family differs", stack: "tcp", via: "127.0.0.1:7000", fam: 6},
		{name: "no gateway", stack: "tcp", fam: 4},
		{name: "a gateway's name", stack: "tcp", via: "gw.example.test:7000", fam: 4},
		{name: "a filter", stack: "zstd", via: "127.0.0.1:7000", fam: 4},
		{name: "a port range", stack: "tcp:ports=40000-40010", via: "127.0.0.1:7000", fam: 4},
		{name: "a key", stack: "tcp", via: "127.0.0.1:7000", fam: 4, cfg: vlink.Config{Key: []byte("0123456789abcdef")}},
		{name: "a node", stack: "tcp", via: "127.0.0.1:7000", fam: 4, cfg: vlink.Config{Node: "alice"}},
		// Checked by an encryption layer, which tcp alone has not.
		{name: "pinned identities", stack: "tcp", via: "127.0.0.1:7000", fam: 4, want: true,
			cfg: vlink.Config{PinnedKey: func(string) []byte { return nil }, PeerKey: func(string, []byte) error { return nil }}},
		{name: "a certificate", stack: "tcp", via: "127.0.0.1:7000", fam: 4, member: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := vlink.Parse(tc.stack)
			if err != nil {
				t.Fatal(err)
			}
			a := &Agent{router: &router{cfg: &tc.cfg}, stacks: &vlink.Dialer{}}
			if tc.member {
				a.stacks.Member = &vlink.Member{}
			}
			d := decision{rule: selector.Rule{Action: selector.Stack, Stack: tc.stack, Via: tc.via}, stack: s}
			if f, _ := a.gatewayFactory(d, tc.fam); (f != nil) != tc.want {
				t.Errorf("gatewayFactory = %v, want a factory: %v", f, tc.want)
			}
		})
	}
}

// gatewayFor serves a vlink.Listener on loopback with policy, which
// dials the targets it admits as vlink serve does, and returns its
// address and the hellos it admitted.
func gatewayFor(t *testing.T, policy vlink.Policy) (netip.AddrPort, chan *vlink.Hello) {
	t.Helper()
	hellos := make(chan *vlink.Hello, 10)
	lc := vlink.ListenConfig{Policy: policy, MaxTargetWait: time.Hour,
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			hellos <- h
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", h.Target)
			if err != nil {
				return nil, vlink.TargetRefusal(err)
			}
			return c, nil
		},
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, func(c net.Conn) {
		vc := c.(*vlink.Conn)
		netconn.Relay(vc, vc.Admitted().(net.Conn))
	})
	return l.Addr().(*net.TCPAddr).AddrPort(), hellos
}

// TestDialGateway: the agent's own hello to a gateway gets the program a
// socket to its target, with the options and the wait the stacks' dialer
// would have named, or fails with the errno the gateway's answer carries:
// the target refused, a gateway that wants a key, one that speaks no
// VLink, one that never answers.
func TestDialGateway(t *testing.T) {
	f := tcp.PreparedLayer("tcp", map[string]string{"cc": "reno", "keepalive": "7s"}, netip.IPv4Unspecified())
	if f == nil {
		t.Fatal("no factory for tcp:cc=reno,keepalive=7s")
	}
	echo := testnet.EchoServer(t)
	allow := []selector.Rule{{Host: "127.0.0.1", Action: selector.Direct}}
	t.Run("accepted", func(t *testing.T) {
		gw, hellos := gatewayFor(t, vlink.Policy{Targets: allow})
		var rec recipe
		fd, err := dialGateway(context.Background(), f, gw, echo, time.Minute, &rec)
		if err != nil {
			t.Fatal(err)
		}
		// The factory's options, on the socket the program gets (before
		// net.FileConn sets its own keep-alives).
		if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE); err != nil || v != 7 {
			t.Errorf("TCP_KEEPIDLE = %d (%v), want 7", v, err)
		}
		// Closed through its *os.File, once: a unix.Close here left the
		// File's finalizer to close the number again, at a GC, under
		// whatever socket had it by then (a later subtest's, which
		// then read EBADF).
		file := os.NewFile(uintptr(fd), "gateway")
		c, err := net.FileConn(file)
		file.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("through the gateway")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 100)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := io.ReadAtLeast(c, b, len("through the gateway")); err != nil || string(b[:n]) != "through the gateway" {
			t.Errorf("echo: %q, %v", b[:n], err)
		}
		h := <-hellos
		if h.CongestionControl != "reno" || h.TargetWait < 50*time.Second || h.TargetWait > time.Minute {
			t.Errorf("the hello named congestion control %q and a wait of %v, want reno and the minute's timeout", h.CongestionControl, h.TargetWait)
		}
		checkRecipe(t, rec, gw, f)
	})
	t.Run("target refused", func(t *testing.T) {
		gw, _ := gatewayFor(t, vlink.Policy{Targets: allow})
		closed, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		_, err = dialGateway(context.Background(), f, gw, closed.Addr().String(), time.Minute, nil)
		var re *vlink.RefusedError
		if !errors.As(err, &re) || errnoOf(err) != syscall.ECONNREFUSED {
			t.Errorf("err = %v, want the gateway's refusal, ECONNREFUSED", err)
		}
	})
	t.Run("a gateway that wants a key", func(t *testing.T) {
		gw, _ := gatewayFor(t, vlink.Policy{Targets: allow, Key: []byte("0123456789abcdef")})
		_, err := dialGateway(context.Background(), f, gw, echo, time.Minute, nil)
		var re *vlink.RefusedError
		if !errors.As(err, &re) || re.Code != vlink.CodeAuthRequired {
			t.Errorf("err = %v, want a refusal asking for the key", err)
		}
	})
	t.Run("no VLink", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			if c, err := l.Accept(); err == nil {
				c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
				c.Close()
			}
		}()
		_, err = dialGateway(context.Background(), f, l.Addr().(*net.TCPAddr).AddrPort(), echo, time.Minute, nil)
		if !errors.Is(err, vlink.ErrNotVLink) {
			t.Errorf("err = %v, want ErrNotVLink", err)
		}
	})
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silentAddr := silent.Addr().(*net.TCPAddr).AddrPort()
	// A gateway that never answers the hello.
	waits(t, func(ctx context.Context, timeout time.Duration) error {
		_, err := dialGateway(ctx, f, silentAddr, echo, timeout, nil)
		return err
	})
}

// checkRecipe: what dialGateway wrote of its connection is what the shim
// needs to make it again: the gateway, the wait, the hello it sent, the
// accept it got, and the factory's options, through the wire format.
func checkRecipe(t *testing.T, rec recipe, gw netip.AddrPort, f *tcp.Factory) {
	t.Helper()
	body, ok := rec.append(nil)
	if !ok {
		t.Fatalf("the recipe does not fit the shim's limits: %+v", rec)
	}
	got, err := parseRecipe(body)
	if err != nil {
		t.Fatal(err)
	}
	if got.gateway != gw || got.waitMs != 60000 || !bytes.HasPrefix(got.hello, []byte("\x89VLK")) || string(got.accept) != "\x01\x04\x00\x00" {
		t.Errorf("recipe: gateway %v wait %d ms hello %q accept %q; want %v, 60000, a hello, the accept frame", got.gateway, got.waitMs, got.hello, got.accept, gw)
	}
	opts := f.SocketOptions()
	if len(got.opts) != len(opts) {
		t.Fatalf("recipe has %d options, the factory %d", len(got.opts), len(opts))
	}
	for i, o := range opts {
		r := got.opts[i]
		want := binary.BigEndian.AppendUint32(nil, uint32(int32(o.Int)))
		if o.Str != "" {
			want = []byte(o.Str)
		}
		if int(r.level) != o.Level || int(r.name) != o.Name || !bytes.Equal(r.val, want) {
			t.Errorf("option %d: level %d name %d value %x, want %d %d %x", i, r.level, r.name, r.val, o.Level, o.Name, want)
		}
	}
}

// TestAnswered: what a recipe's gateway answered instead of the accept
// gets the program the errno the agent's own connect would have: the
// refusal's, ETIMEDOUT, and 0 for an accept of another form.
func TestAnswered(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler)}
	q := &vlink.QuickHello{}
	for _, tc := range []struct {
		name     string
		answer   []byte
		timedOut bool
		want     syscall.Errno
	}{
		{"target refused", q.Refusal(vlink.TargetRefusal(syscall.ECONNREFUSED)), false, syscall.ECONNREFUSED},
		{"target unreachable", q.Refusal(vlink.TargetRefusal(syscall.EHOSTUNREACH)), false, syscall.EHOSTUNREACH},
		{"target not allowed", q.Refusal(&vlink.RefusedError{Code: vlink.CodeTarget, Reason: "no"}), false, syscall.EACCES},
		{"the gateway closed", nil, false, syscall.ECONNREFUSED},
		{"no VLink", []byte("SSH-2.0-OpenSSH_9.2\r\n"), false, syscall.ECONNREFUSED},
		{"timed out", []byte("\x01"), true, syscall.ETIMEDOUT},
		{"an accept", []byte("\x01\x04\x00\x00"), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := sampleAnswer("127.0.0.1:80", tc.timedOut, string(tc.answer))
			if got := a.answered(1, &m); got != tc.want {
				t.Errorf("errno %v, want %v", got, tc.want)
			}
		})
	}
}

package socks_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/factories/socks"
	_ "github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t testing.TB, stack, addr string) (net.Conn, error) {
	t.Helper()
	s, err := vlink.Parse(stack)
	if err != nil {
		t.Fatal(err)
	}
	d := vlink.Dialer{Stack: s, Timeout: 10 * time.Second}
	return d.Dial("tcp", addr)
}

func TestParams(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pwFile, []byte("secret\n"), 0o600)
	for _, tc := range []struct {
		stack string
		want  string // part of the error; "" for success
	}{
		{"socks5", "missing required parameter addr"},
		{"socks5:addr=127.0.0.1:1080", ""},
		{"socks4a:addr=127.0.0.1:1080,user=bob", ""},
		{"socks4:addr=127.0.0.1:1080,password-file=x", "unknown parameter"},
		{"socks5:addr=127.0.0.1:1080,user=bob", "no password"},
		{"socks5:addr=127.0.0.1:1080,user=bob,password-file=" + pwFile, ""},
		{"socks5:addr=127.0.0.1:1080,resolve=maybe", "want remote or local"},
		{"socks5:addr=nohost", "addr="},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			s, err := vlink.Parse(tc.stack)
			if err == nil {
				// Building the layer happens at dial time: dial a port
				// nothing listens on to get there.
				var c net.Conn
				d := vlink.Dialer{Stack: s, Timeout: 2 * time.Second}
				c, err = d.Dial("tcp", "127.0.0.1:1")
				if c != nil {
					c.Close()
				}
				if tc.want == "" {
					if err == nil || !strings.Contains(err.Error(), "reaching the proxy") {
						t.Fatalf("dial = %v, want a failure to reach the proxy", err)
					}
					return
				}
			}
			if tc.want == "" || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestRedacted checks that neither the password nor the user name (a
// proxy URL's user-info too) appears in a description.
func TestRedacted(t *testing.T) {
	f, err := socks.New(socks.Options{Version: socks.V5, Proxy: "p:1080", User: "bob", Password: "hunter2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{f.String(), socks.Options{Password: "hunter2"}.String(), socks.Options{Version: socks.V4, User: "bob"}.String()} {
		if strings.Contains(s, "hunter2") || strings.Contains(s, "bob") {
			t.Fatalf("description %q shows the password or the user", s)
		}
	}
}

// fakeProxy answers each connection with script,
// which reads what the client sent and writes whatever it likes.
func fakeProxy(t *testing.T, script func(c net.Conn)) string {
	t.Helper()
	return testnet.Listen(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		script(c)
	})
}

func readN(c net.Conn, n int) []byte {
	b := make([]byte, n)
	io.ReadFull(c, b)
	return b
}

// TestBadProxies checks that each hostile or failing answer gives a clear
// error naming the proxy, matching the right sentinel.
func TestBadProxies(t *testing.T) {
	greet := func(c net.Conn, method byte) { readN(c, 3); c.Write([]byte{5, method}) }
	request := func(c net.Conn) { readN(c, 4+4+2) }
	for _, tc := range []struct {
		name   string
		layer  string
		script func(c net.Conn)
		is     []error
		says   string
	}{
		{"socks5 garbage", "socks5", func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) },
			[]error{socks.ErrProtocol}, "is it a SOCKS5 proxy"},
		// It reads the greeting first: closing with it unread would send
		// a reset, which may overtake the end of the stream.
		{"socks5 closes at once", "socks5", func(c net.Conn) { readN(c, 3) },
			[]error{io.ErrUnexpectedEOF}, "closed the connection"},
		{"socks5 closes mid-reply", "socks5", func(c net.Conn) { greet(c, 0); request(c); c.Write([]byte{5, 0, 0}) },
			[]error{io.ErrUnexpectedEOF}, "before its reply"},
		{"socks5 wants auth", "socks5", func(c net.Conn) { greet(c, 0xff) },
			[]error{socks.ErrAuth, vlink.ErrAuth}, "accepts no method"},
		{"socks5 picks unoffered method", "socks5", func(c net.Conn) { greet(c, 2) },
			[]error{socks.ErrAuth}, "requires a user name"},
		{"socks5 refuses", "socks5", func(c net.Conn) {
			greet(c, 0)
			request(c)
			c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		}, []error{socks.ErrRefused, vlink.ErrUnreachable, syscall.ECONNREFUSED}, "connection refused (reply code 5)"},
		{"socks5 not allowed", "socks5", func(c net.Conn) {
			greet(c, 0)
			request(c)
			c.Write([]byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0})
		}, []error{socks.ErrRefused, vlink.ErrNotAllowed}, "not allowed by ruleset"},
		{"socks5 bad address type", "socks5", func(c net.Conn) {
			greet(c, 0)
			request(c)
			c.Write([]byte{5, 0, 0, 9, 0, 0, 0, 0, 0, 0})
		}, []error{socks.ErrProtocol}, "Bad Reply"},
		{"socks5 silent", "socks5", func(c net.Conn) { io.Copy(io.Discard, c) },
			[]error{os.ErrDeadlineExceeded, context.DeadlineExceeded}, "deadline"},
		{"socks4 garbage", "socks4a", func(c net.Conn) { readN(c, 9); c.Write([]byte("SSH-2.0-x")) },
			[]error{socks.ErrProtocol}, "reply version 83"},
		{"socks4 rejects", "socks4a", func(c net.Conn) { readN(c, 9); c.Write([]byte{0, 91, 0, 0, 0, 0, 0, 0}) },
			[]error{socks.ErrRefused}, "rejected or failed (reply code 91)"},
		{"socks4 short", "socks4a", func(c net.Conn) { readN(c, 9); c.Write([]byte{0, 90, 0}) },
			[]error{io.ErrUnexpectedEOF}, "unexpected EOF"},
		{"socks4 unknown code", "socks4a", func(c net.Conn) { readN(c, 9); c.Write([]byte{0, 7, 0, 0, 0, 0, 0, 0}) },
			[]error{socks.ErrProtocol}, "unknown SOCKS4 reply code 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := fakeProxy(t, tc.script)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			s := vlink.MustParse(tc.layer + ":addr=" + proxy)
			d := vlink.Dialer{Stack: s}
			c, err := d.DialContext(ctx, "tcp", "127.0.0.1:4321")
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			for _, target := range tc.is {
				if !errors.Is(err, target) {
					t.Errorf("error %q does not match %v", err, target)
				}
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %q does not say %q", err, tc.says)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Net != tc.layer || oe.Addr == nil || oe.Addr.String() != proxy {
				t.Errorf("error %#v is not a *net.OpError naming %s %s", err, tc.layer, proxy)
			}
		})
	}
}

// TestRequestBytes checks what the clients put on the wire, against the
// protocols' documents.
func TestRequestBytes(t *testing.T) {
	for _, tc := range []struct {
		name, stack, dest string
		want              []byte
	}{
		{"socks4 ip", "socks4:user=bob", "10.1.2.3:80", []byte{4, 1, 0, 80, 10, 1, 2, 3, 'b', 'o', 'b', 0}},
		{"socks4a name", "socks4a", "example.org:443", append([]byte{4, 1, 1, 187, 0, 0, 0, 1, 0}, "example.org\x00"...)},
		{"socks4a ip", "socks4a", "10.1.2.3:80", []byte{4, 1, 0, 80, 10, 1, 2, 3, 0}},
		{"socks5 name", "socks5", "internal-name:8080", append(append([]byte{5, 1, 0, 3, 13}, "internal-name"...), 0x1f, 0x90)},
		{"socks5 ipv6", "socks5", "[::1]:22", []byte{5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 22}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			proxy := fakeProxy(t, func(c net.Conn) {
				if strings.HasPrefix(tc.stack, "socks5") {
					readN(c, 3)
					c.Write([]byte{5, 0})
				}
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				b, _ := io.ReadAll(c)
				got <- b
			})
			layer, params, _ := strings.Cut(tc.stack, ":")
			stack := layer + ":addr=" + proxy
			if params != "" {
				stack += "," + params
			}
			c, err := dial(t, stack, tc.dest)
			if err == nil {
				c.Close()
			}
			if b := <-got; !bytes.Equal(b, tc.want) {
				t.Fatalf("request\n got % x\nwant % x", b, tc.want)
			}
		})
	}
	if _, err := dial(t, "socks4a:addr=127.0.0.1:1", "[::1]:80"); err == nil || !strings.Contains(err.Error(), "IPv4 addresses only") {
		t.Fatalf("socks4a to an IPv6 address: %v", err)
	}
	long := strings.Repeat("a", 256) + ":80"
	if _, err := dial(t, "socks5:addr=127.0.0.1:1", long); err == nil || !strings.Contains(err.Error(), "longer than 255") {
		t.Fatalf("socks5 to a 256-byte name: %v", err)
	}
}

// TestContextCancel checks that cancelling the context interrupts a
// handshake the proxy never answers, and the error says so.
func TestContextCancel(t *testing.T) {
	proxy := fakeProxy(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	d := vlink.Dialer{Stack: vlink.MustParse("socks5:addr=" + proxy)}
	start := time.Now()
	_, err := d.DialContext(ctx, "tcp", "127.0.0.1:80")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("dial = %v, want context.Canceled", err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("cancel took %v to interrupt the handshake", time.Since(start))
	}
}

package httpconnect_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/factories/httpconnect"
	_ "github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t testing.TB, stack, addr string) (net.Conn, error) {
	t.Helper()
	d := vlink.Dialer{Stack: vlink.MustParse(stack), Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// fakeProxy answers each connection with script.
func fakeProxy(t *testing.T, script func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	return testnet.Listen(t, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		script(c, bufio.NewReader(c))
	})
}

// readRequest reads the CONNECT request header.
func readRequest(br *bufio.Reader) *http.Request {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil
	}
	return req
}

func TestRequest(t *testing.T) {
	got := make(chan *http.Request, 1)
	proxy := fakeProxy(t, func(c net.Conn, br *bufio.Reader) {
		got <- readRequest(br)
		// The tunnel's first bytes arrive with the response header.
		io.WriteString(c, "HTTP/1.1 200 Connection established\r\nProxy-Agent: fake\r\n\r\nSSH-2.0-early\r\n")
		io.Copy(c, br)
	})
	pw := t.TempDir() + "/pw"
	os.WriteFile(pw, []byte("pass word\n"), 0o600)
	c, err := dial(t, fmt.Sprintf("http:addr=%s,user=alice,password-file=%s", proxy, pw), "internal-name:22")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := <-got
	if req == nil || req.Method != "CONNECT" || req.RequestURI != "internal-name:22" || req.Host != "internal-name:22" {
		t.Fatalf("request = %+v", req)
	}
	if u, p, ok := parseBasic(req.Header.Get("Proxy-Authorization")); !ok || u != "alice" || p != "pass word" {
		t.Fatalf("Proxy-Authorization = %q", req.Header.Get("Proxy-Authorization"))
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(c, 15)).ReadString('\n')
	if line != "SSH-2.0-early\r\n" {
		t.Fatalf("first bytes of the tunnel = %q, %v: the bytes after the header were lost", line, err)
	}
	io.WriteString(c, "ping")
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo = %q, %v", b, err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
}

func parseBasic(h string) (string, string, bool) {
	r := http.Request{Header: http.Header{"Authorization": {h}}}
	return r.BasicAuth()
}

func TestBadProxies(t *testing.T) {
	answer := func(s string) func(net.Conn, *bufio.Reader) {
		return func(c net.Conn, br *bufio.Reader) { readRequest(br); io.WriteString(c, s) }
	}
	for _, tc := range []struct {
		name   string
		script func(net.Conn, *bufio.Reader)
		is     []error
		says   string
	}{
		{"407", answer("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n"),
			[]error{httpconnect.ErrAuth, vlink.ErrAuth, httpconnect.ErrRefused}, `"407 Proxy Authentication Required"`},
		{"403", answer("HTTP/1.0 403 Access violation\r\n\r\n<html>"),
			[]error{httpconnect.ErrRefused, vlink.ErrNotAllowed}, `"403 Access violation"`},
		{"502", answer("HTTP/1.1 502 Bad Gateway\r\n\r\n"),
			[]error{httpconnect.ErrRefused, vlink.ErrUnreachable}, "502"},
		{"garbage", answer("SSH-2.0-OpenSSH_9.2\r\n\r\n"), []error{httpconnect.ErrProtocol}, "malformed"},
		{"closes at once", func(c net.Conn, br *bufio.Reader) { readRequest(br) }, []error{io.ErrUnexpectedEOF}, "closed the connection"},
		{"closes mid-header", answer("HTTP/1.1 200 OK\r\nX-A: b"), []error{io.ErrUnexpectedEOF}, "closed the connection"},
		{"endless header", func(c net.Conn, br *bufio.Reader) {
			readRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\n")
			line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
			for i := 0; i < 200; i++ {
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		}, []error{httpconnect.ErrProtocol}, "larger than 65536 bytes"},
		{"silent", func(c net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) },
			[]error{context.DeadlineExceeded, os.ErrDeadlineExceeded}, "deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := fakeProxy(t, tc.script)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			d := vlink.Dialer{Stack: vlink.MustParse("http:addr=" + proxy)}
			c, err := d.DialContext(ctx, "tcp", "127.0.0.1:22")
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
			if !errors.As(err, &oe) || oe.Net != "http" || oe.Addr == nil || oe.Addr.String() != proxy {
				t.Errorf("error %#v is not a *net.OpError naming http %s", err, proxy)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	for _, dest := range []string{"a b:80", "host:80\r\nX-Evil: 1", "user@host:80", "host:0", "host:http", ":80"} {
		if c, err := dial(t, "http:addr=127.0.0.1:1", dest); err == nil || strings.Contains(err.Error(), "reaching the proxy") {
			if c != nil {
				c.Close()
			}
			t.Errorf("destination %q: %v, want it refused before dialing", dest, err)
		}
	}
	if _, err := httpconnect.New(httpconnect.Options{Proxy: "p:3128", User: "a:b", Password: "x"}); !errors.Is(err, vlink.ErrBadParam) {
		t.Errorf("user with ':' = %v, want ErrBadParam", err)
	}
	// The user name is user-info too, as a proxy URL gives it: neither
	// it nor the password shows in String or an error.
	f, _ := httpconnect.New(httpconnect.Options{Proxy: "p:3128", User: "Al1ce", Password: "hunter2"})
	if s := f.String(); strings.Contains(s, "hunter2") || strings.Contains(s, "Al1ce") {
		t.Errorf("String shows the user or the password: %s", s)
	}
	if _, err := httpconnect.New(httpconnect.Options{Proxy: "p:3128", User: "Al1ce"}); err == nil || strings.Contains(err.Error(), "Al1ce") {
		t.Errorf("user without a password = %v, want an error without the user name", err)
	}
}

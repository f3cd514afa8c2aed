package socks_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// recordingDialer dials directly and records the addresses it was asked
// for, so tests see whether names reached it unresolved.
type recordingDialer struct {
	mu    sync.Mutex
	asked []string
	err   error
}

func (d *recordingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.asked = append(d.asked, address)
	err := d.err
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, address)
}

// startServer serves srv on a loopback port until the test ends.
func startServer(t testing.TB, srv *socks.Server) (string, chan error) {
	t.Helper()
	errs := make(chan error, 100)
	addr := testnet.Listen(t, func(c net.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, _, err := srv.Handshake(ctx, c)
		cancel()
		if err != nil {
			select {
			case errs <- err:
			default:
			}
			return
		}
		netconn.Relay(c, out)
	})
	return addr, errs
}

func TestServer(t *testing.T) {
	echo := testnet.EchoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	rd := &recordingDialer{}
	addr, _ := startServer(t, &socks.Server{Dialer: rd})
	for _, tc := range []struct{ layer, dest, asked string }{
		{"socks4", echo, echo},
		{"socks4a", "localhost:" + port, "localhost:" + port},
		{"socks5", "localhost:" + port, "localhost:" + port},
		{"socks5", echo, echo},
		{"socks5", "[::1]:1", "[::1]:1"},
	} {
		t.Run(tc.layer+"/"+tc.dest, func(t *testing.T) {
			c, err := dial(t, tc.layer+":addr="+addr, tc.dest)
			if tc.dest == "[::1]:1" {
				// Nothing listens there: the refusal comes back as a
				// reply code.
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("dial = %v, want ECONNREFUSED through the reply code", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				testnet.RoundTrip(t, c, 200<<10)
				c.Close()
			}
			rd.mu.Lock()
			last := rd.asked[len(rd.asked)-1]
			rd.mu.Unlock()
			if last != tc.asked {
				t.Fatalf("the server dialed %q, want %q (names unresolved)", last, tc.asked)
			}
		})
	}
}

func TestServerAuth(t *testing.T) {
	echo := testnet.EchoServer(t)
	addr, errs := startServer(t, &socks.Server{Dialer: &recordingDialer{}, User: "alice", Password: "pw"})
	t.Setenv("VLINK_TEST_SRV_PW", "pw")
	t.Setenv("VLINK_TEST_SRV_BAD", "pW")
	c, err := dial(t, "socks5:user=alice,password-env=VLINK_TEST_SRV_PW,addr="+addr, echo)
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	for _, tc := range []struct{ stack, says string }{
		{"socks5:user=alice,password-env=VLINK_TEST_SRV_BAD,addr=" + addr, "wrong user name or password"},
		{"socks5:addr=" + addr, "offers none"},
		{"socks4a:addr=" + addr, "cannot authenticate"},
	} {
		_, err := dial(t, tc.stack, echo)
		if err == nil {
			t.Fatalf("%s: dial succeeded", tc.stack)
		}
		if !strings.HasPrefix(tc.stack, "socks4") && !errors.Is(err, vlink.ErrAuth) {
			t.Errorf("%s: client error %v, want ErrAuth", tc.stack, err)
		}
		if strings.Contains(err.Error(), "alice") {
			t.Errorf("%s: client error %v shows the user name", tc.stack, err)
		}
		select {
		case serr := <-errs:
			if !errors.Is(serr, socks.ErrClientAuth) || !strings.Contains(serr.Error(), tc.says) {
				t.Errorf("%s: server error %v, want ErrClientAuth saying %q", tc.stack, serr, tc.says)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the server reported nothing", tc.stack)
		}
	}
}

// TestServerRefusals checks the reply codes a client sees for dial
// failures and unsupported requests.
func TestServerRefusals(t *testing.T) {
	rd := &recordingDialer{err: &net.OpError{Op: "dial", Net: "vlink", Err: vlink.ErrDirectRefused}}
	addr, _ := startServer(t, &socks.Server{Dialer: rd})
	_, err := dial(t, "socks5:addr="+addr, "10.0.0.1:80")
	var re *socks.ReplyError
	if !errors.As(err, &re) || re.Code != 2 {
		t.Fatalf("refused by the rules: %v, want reply code 2", err)
	}
	_, err = dial(t, "socks4:addr="+addr, "10.0.0.1:80")
	if !errors.As(err, &re) || re.Code != 91 {
		t.Fatalf("SOCKS4 refused: %v, want reply code 91", err)
	}

	// BIND is not served.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte{5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80})
	b, _ := io.ReadAll(c)
	if len(b) < 4 || b[2+1] != 7 {
		t.Fatalf("BIND answered % x, want reply code 7", b)
	}
	// Not SOCKS at all.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c2, "GET / HTTP/1.1\r\n\r\n")
	if b, _ := io.ReadAll(c2); len(b) != 0 {
		t.Fatalf("an HTTP request got % x, want the connection closed", b)
	}
}

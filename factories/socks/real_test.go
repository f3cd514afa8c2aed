//go:build linux

package socks_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// TestOpenSSHDynamic runs each client against OpenSSH's own SOCKS server,
// ssh -D, which speaks SOCKS4, SOCKS4a and SOCKS5, and moves data through
// it to an echo server, by address and by name.
func TestOpenSSHDynamic(t *testing.T) {
	sshd := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	proxy := sshd.StartDynamic(t)
	echo := testnet.EchoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	for _, tc := range []struct{ layer, dest string }{
		{"socks4", echo},
		{"socks4", "localhost:" + port}, // resolved here
		{"socks4a", echo},
		{"socks4a", "localhost:" + port}, // resolved by sshd
		{"socks5", echo},
		{"socks5", "localhost:" + port},
		{"socks5:resolve=local", "localhost:" + port},
	} {
		t.Run(tc.layer+"/"+tc.dest, func(t *testing.T) {
			layer, params, _ := strings.Cut(tc.layer, ":")
			stack := layer + ":addr=" + proxy
			if params != "" {
				stack += "," + params
			}
			c, err := dial(t, stack, tc.dest)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, ok := c.(*net.TCPConn); !ok {
				t.Errorf("connection is a %T, want the proxy's *net.TCPConn unwrapped", c)
			}
			testnet.RoundTrip(t, c, 1<<20+3)
		})
	}
	// A destination sshd cannot reach: ssh -D sends no failure reply, it
	// closes the client's connection.
	closed := testnet.RefusedAddr(t)
	for _, layer := range []string{"socks4a", "socks5"} {
		_, err := dial(t, layer+":addr="+proxy, closed)
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), proxy) {
			t.Errorf("%s to a closed port: %v, want io.ErrUnexpectedEOF naming %s", layer, err, proxy)
		}
	}
}

// TestDante runs the SOCKS5 client against dante with username
// authentication: right and wrong credentials, a destination its rules
// block, and remote name resolution.
func TestDante(t *testing.T) {
	d := realserver.StartDante(t, true)
	echo := testnet.EchoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	t.Setenv("VLINK_TEST_DANTE_PW", d.Password)
	t.Setenv("VLINK_TEST_DANTE_BAD", d.Password+"x")
	good := fmt.Sprintf("socks5:addr=%s,user=%s,password-env=VLINK_TEST_DANTE_PW", d.Addr, d.User)

	for _, dest := range []string{echo, "localhost:" + port} {
		c, err := dial(t, good, dest)
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		testnet.RoundTrip(t, c, 3<<20)
		c.Close()
	}

	_, err := dial(t, fmt.Sprintf("socks5:addr=%s,user=%s,password-env=VLINK_TEST_DANTE_BAD", d.Addr, d.User), echo)
	if !errors.Is(err, socks.ErrAuth) || !errors.Is(err, vlink.ErrAuth) || !strings.Contains(err.Error(), d.Addr) {
		t.Errorf("wrong password: %v, want ErrAuth naming %s", err, d.Addr)
	}
	if strings.Contains(fmt.Sprint(err), d.Password) {
		t.Errorf("the error shows the password: %v", err)
	}
	_, err = dial(t, "socks5:addr="+d.Addr, echo)
	if !errors.Is(err, socks.ErrAuth) {
		t.Errorf("no credentials: %v, want ErrAuth", err)
	}
	_, err = dial(t, good, fmt.Sprintf("127.0.0.1:%d", d.BlockedPort))
	if !errors.Is(err, socks.ErrRefused) || !errors.Is(err, vlink.ErrNotAllowed) {
		t.Errorf("blocked destination: %v, want ErrRefused and ErrNotAllowed", err)
	}
	var re *socks.ReplyError
	if !errors.As(err, &re) || re.Code != 2 {
		t.Errorf("blocked destination: %v, want reply code 2", err)
	}
	_, err = dial(t, good, fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t)))
	if !errors.Is(err, socks.ErrRefused) || !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, vlink.ErrUnreachable) {
		t.Errorf("closed port: %v, want ErrRefused, ECONNREFUSED and ErrUnreachable", err)
	}
}

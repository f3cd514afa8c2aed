//go:build linux

package httpconnect_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/httpconnect"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// TestTinyproxy runs the http factory against tinyproxy with basic
// authentication and a ConnectPort rule: data through it keeps its
// SHA-256, wrong or missing credentials are ErrAuth, a port the rules do
// not allow is a 403 refusal.
func TestTinyproxy(t *testing.T) {
	echo := testnet.EchoServer(t)
	_, ps, _ := net.SplitHostPort(echo)
	port, _ := strconv.Atoi(ps)
	_, proxy := realserver.StartTinyproxy(t, realserver.TinyproxyOptions{User: "bob", Password: "s3cret", ConnectPorts: []int{port}})
	t.Setenv("VLINK_TEST_HTTP_PW", "s3cret")
	t.Setenv("VLINK_TEST_HTTP_BAD", "wrong")
	good := "http:addr=" + proxy + ",user=bob,password-env=VLINK_TEST_HTTP_PW"

	for _, dest := range []string{echo, "localhost:" + strconv.Itoa(port)} {
		c, err := dial(t, good, dest)
		if err != nil {
			t.Fatalf("%s: %v", dest, err)
		}
		data := make([]byte, 2<<20+5)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		// tinyproxy ends both directions when one ends (no half-close),
		// so read back exactly what was sent rather than up to EOF.
		go c.Write(data)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		got := make([]byte, len(data))
		_, err = io.ReadFull(c, got)
		c.Close()
		if err != nil || testnet.Sum(got) != testnet.Sum(data) {
			t.Fatalf("%s: echo of %d bytes: got %d bytes, %v", dest, len(data), len(got), err)
		}
	}

	_, err := dial(t, "http:addr="+proxy+",user=bob,password-env=VLINK_TEST_HTTP_BAD", echo)
	if !errors.Is(err, httpconnect.ErrAuth) || !strings.Contains(err.Error(), proxy) || strings.Contains(err.Error(), "wrong") {
		t.Errorf("wrong password: %v, want ErrAuth naming %s and not the password", err, proxy)
	}
	_, err = dial(t, "http:addr="+proxy, echo)
	if !errors.Is(err, vlink.ErrAuth) {
		t.Errorf("no credentials: %v, want ErrAuth", err)
	}
	_, err = dial(t, good, fmt.Sprintf("127.0.0.1:%d", port+1))
	var se *httpconnect.StatusError
	if !errors.As(err, &se) || se.StatusCode != 403 || !errors.Is(err, vlink.ErrNotAllowed) {
		t.Errorf("port outside ConnectPort: %v, want a 403 StatusError", err)
	}
}

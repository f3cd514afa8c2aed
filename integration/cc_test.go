package integration

import (
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestCongestionControl: vlink tunnel --stack identity+tcp:cc=reno sends
// with reno, and its hello has vlink serve send with reno on its side of
// the same connection, as ss shows for both sockets; the connection to
// the target keeps the system's default. reno is built into every
// kernel, and the default of none.
func TestCongestionControl(t *testing.T) {
	testenv.Programs(t, "socat", "ss")
	_, echo := startSocatEcho(t)
	_, gw := startVLink(t, "serve", "--target", echo)
	_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "identity+tcp:cc=reno")
	c, err := net.Dial("tcp", tun)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// An echo, and the connection stays open for ss to see.
	msg := []byte("hello through reno")
	got := make([]byte, len(msg))
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}
	// ss -i prints each socket's congestion control on its info line.
	cc := func(filter ...string) string {
		out, err := exec.Command("ss", append([]string{"-Hti", "state", "established"}, filter...)...).Output()
		if err != nil {
			t.Fatalf("ss: %v", err)
		}
		return string(out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		dialer, listener := cc("dst", gw), cc("src", gw)
		if strings.Contains(dialer, " reno ") && strings.Contains(listener, " reno ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tunnel's socket to the gateway:\n%s\nthe gateway's:\n%s\nwant reno on both", dialer, listener)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if target := cc("dst", echo); strings.Contains(target, " reno ") {
		t.Errorf("the gateway's connection to its target took reno too:\n%s", target)
	}
}

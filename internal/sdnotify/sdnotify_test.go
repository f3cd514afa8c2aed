package sdnotify

import (
	"net"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	for _, tc := range []struct{ name, addr string }{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", "@vlink-sdnotify-test-" + time.Now().Format("150405.000000000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: tc.addr, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			t.Setenv(EnvSocket, tc.addr)
			if err := Notify(Reloading()); err != nil {
				t.Fatal(err)
			}
			if err := Notify(Ready, Status("2 forwards\nrunning")); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 512)
			for _, want := range []string{`^RELOADING=1\nMONOTONIC_USEC=[1-9]\d*\n$`, `^READY=1\nSTATUS=2 forwards running\n$`} {
				n, err := c.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				if !regexp.MustCompile(want).Match(buf[:n]) {
					t.Errorf("got %q, want %s", buf[:n], want)
				}
			}
		})
	}
}

func TestNotifyOutsideSystemd(t *testing.T) {
	t.Setenv(EnvSocket, "")
	if err := Notify(Ready); err != nil {
		t.Errorf("without %s: %v, want nil", EnvSocket, err)
	}
	t.Setenv(EnvSocket, "vsock:2:1234")
	if err := Notify(Ready); err == nil {
		t.Errorf("a vsock address: want an error saying it is not supported")
	}
	t.Setenv(EnvSocket, filepath.Join(t.TempDir(), "nobody-listens"))
	if err := Notify(Ready); err == nil {
		t.Errorf("a socket nobody listens on: want an error")
	}
}

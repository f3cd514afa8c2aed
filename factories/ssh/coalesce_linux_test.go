//go:build linux

package ssh

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/internal/realserver"
)

// TestFramerOnSSHD checks, against a real sshd, that with GCM ciphers the
// framer follows the stream to the end of a bulk transfer (it never had
// to step aside), and that it stays out of the way otherwise.
func TestFramerOnSSHD(t *testing.T) {
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	t.Cleanup(CloseAll)
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	for _, tc := range []struct {
		cipher string
		framed bool
	}{{"aes128-gcm@openssh.com", true}, {"chacha20-poly1305@openssh.com", false}} {
		f, err := New(Options{Host: s.Host, Port: s.Port, User: s.User, IdentityFiles: []string{s.UserKey.Private},
			KnownHosts: []string{s.KnownHosts}, NoAgent: true, ConfigFile: "none", Ciphers: []string{tc.cipher}, NoShare: true})
		if err != nil {
			t.Fatal(err)
		}
		sess, err := f.session(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := openDirect(context.Background(), sess, "127.0.0.1", sink.Addr().(*net.TCPAddr).Port, sink.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		for i := 0; i < 16; i++ {
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		fr := sess.tr.framer
		switch {
		case !tc.framed && fr != nil:
			t.Errorf("%s: the framer is on, but the length is encrypted", tc.cipher)
		case tc.framed && fr == nil:
			t.Errorf("%s: no framer", tc.cipher)
		case tc.framed:
			if off, keyed := fr.state(); off || !keyed {
				t.Errorf("%s: the framer lost track of the packets (off %v, keyed %v)", tc.cipher, off, keyed)
			}
		}
		c.Close()
	}
}

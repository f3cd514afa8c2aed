package vlink_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// TestSilentDialersDoNotStall fills every handshake slot of a listener,
// several times over, with dialers that open a handshake and go silent
// (as an attacker holding the port would), then dials as a legitimate
// client holding the key: it must get through at once, not after the
// handshake timeout, whether it comes from another address or from the
// attacker's own.
// magic opens a VLink hello (vlink/frame.go).
const magic = "\x89VLK\r\n\x1a\n"

func TestSilentDialersDoNotStall(t *testing.T) {
	const (
		slots   = 16
		hostile = 4 * slots
		timeout = time.Minute // what a waiting client would wait
		prompt  = 5 * time.Second
	)
	for _, tc := range []struct {
		name     string
		send     string // what each hostile dialer sends before going silent
		attacker string // its address; the legitimate client dials from 127.0.0.1
	}{
		{"magic, then silence", magic, "127.0.0.2"},
		{"nothing", "", "127.0.0.2"},
		{"half a hello", magic + "\x01\x01\x00\x28\x01", "127.0.0.2"},
		{"magic, then silence, from the client's address", magic, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, vlink.ListenConfig{
				Policy:           vlink.Policy{Key: key},
				HandshakeTimeout: timeout,
				SniffTimeout:     -1, // silence never makes a connection plain
				MaxHandshakes:    slots,
			})
			attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(tc.attacker)}}
			for range hostile {
				c, err := attacker.Dial("tcp", l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Write([]byte(tc.send)); err != nil {
					t.Fatal(err)
				}
			}
			d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: timeout}
			ctx, cancel := context.WithTimeout(context.Background(), prompt)
			defer cancel()
			start := time.Now()
			c, err := d.DialContext(ctx, "tcp", l.Addr().String())
			if err != nil {
				t.Fatalf("dial with %d silent dialers holding %d slots: %v after %v", hostile, slots, err, time.Since(start))
			}
			defer c.Close()
			t.Logf("connected in %v", time.Since(start))
			testnet.RoundTrip(t, c, 64<<10)
		})
	}
}

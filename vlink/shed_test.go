package vlink_test

import (
	"context"
	"errors"
	"net"
	"os"
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

// TestSheddingWithoutChurn: dialers of one address that open more
// handshakes than there are slots and go silent are parked, not closed
// (closing them would only make them reconnect, a flood the accept loop
// spends itself on); a client from another address still gets a slot at
// once, which costs the parked address one connection; parked
// connections are closed when their handshake time is up.
func TestSheddingWithoutChurn(t *testing.T) {
	const (
		slots   = 8
		hostile = 5 * slots
		timeout = 2 * time.Second
	)
	l := listen(t, vlink.ListenConfig{
		Policy:           vlink.Policy{Key: key},
		HandshakeTimeout: timeout,
		SniffTimeout:     -1,
		MaxHandshakes:    slots,
	})
	attacker := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	var conns []net.Conn
	for range hostile {
		c, err := attacker.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(magic)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// closed counts the hostile connections the listener has closed.
	closed := func() int {
		n := 0
		for _, c := range conns {
			c.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
				n++
			}
		}
		return n
	}
	// atLeast waits a while for want of them to be closed (a FIN may
	// take a moment on a loaded machine), then counts them once more.
	atLeast := func(want int) int {
		for deadline := time.Now().Add(2 * time.Second); closed() < want && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		return closed()
	}
	time.Sleep(200 * time.Millisecond) // the listener accepts them all
	if n := closed(); n != 0 {
		t.Fatalf("the listener closed %d of %d silent connections from one address; want them parked", n, hostile)
	}
	d := vlink.Dialer{Key: key, Stack: vlink.MustParse("test-filter"), Timeout: timeout}
	start := time.Now()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial beside %d parked connections: %v", hostile-slots, err)
	}
	t.Logf("connected in %v", time.Since(start))
	testnet.RoundTrip(t, c, 1<<10)
	c.Close()
	if n := atLeast(1); n != 1 {
		t.Fatalf("%d silent connections closed for one client; want 1", n)
	}
	time.Sleep(timeout + 4*sweepEvery)
	if n := atLeast(hostile); n != hostile {
		t.Fatalf("%d of %d silent connections closed once their handshake time was up", n, hostile)
	}

	// Closing the listener closes what it parked, at once.
	conns = conns[:0]
	for range hostile {
		c, err := attacker.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte(magic))
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond)
	if n := closed(); n != 0 {
		t.Fatalf("%d of %d new silent connections closed; want them held", n, hostile)
	}
	l.Close()
	if n := atLeast(hostile); n != hostile {
		t.Fatalf("%d of %d silent connections closed with the listener", n, hostile)
	}
}

// sweepEvery is vlink's sweep period for parked connections.
const sweepEvery = 50 * time.Millisecond

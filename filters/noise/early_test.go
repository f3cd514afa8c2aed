package noise

import (
	"bytes"
	"io"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// fakeFlight is a layer.FirstFlight whose listener took the hello: it
// records what the layer sent and what it learned.
type fakeFlight struct {
	sent   []byte
	learnt []bool // TakesEarly's calls
}

func (f *fakeFlight) Hello(int) []byte                       { return []byte("hello") }
func (f *fakeFlight) Send(msg []byte) error                  { f.sent = bytes.Clone(msg); return nil }
func (f *fakeFlight) TakesEarly(ok bool)                     { f.learnt = append(f.learnt, ok) }
func (f *fakeFlight) Answer() (layer.Handshake, bool, error) { return layer.Handshake{}, true, nil }

// TestEarlyConn: a dialer's connection waiting for its first bytes sends
// nothing until its handshake runs, then the bytes written so far in the
// first message; one closed before that sends nothing at all; and when
// the listener takes the hello but fails the message (one from before
// early data), the dialer forgets that it takes early data.
func TestEarlyConn(t *testing.T) {
	hs := layer.Handshake{Key: testKey, PeerStatic: make([]byte, 32), Early: true}
	hs.PeerStatic[0] = 9 // the curve's base point: any public key will do

	t.Run("closed before its handshake", func(t *testing.T) {
		ff := &fakeFlight{}
		hs := hs
		hs.FirstFlight = ff
		var wire bytes.Buffer
		c, err := Filter{}.ClientHandshake(&testnet.FakeConn{W: &wire}, hs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if ff.sent != nil || wire.Len() > 0 {
			t.Fatalf("sent %d bytes and %d on the wire; want nothing", len(ff.sent), wire.Len())
		}
		if _, err := c.Write([]byte("more")); err == nil {
			t.Fatal("a write after Close succeeded")
		}
	})

	t.Run("refused by a listener from before early data", func(t *testing.T) {
		ff := &fakeFlight{}
		hs := hs
		hs.FirstFlight = ff
		// The listener took the hello, then closed: no answer.
		c, err := Filter{}.ClientHandshake(&testnet.FakeConn{R: bytes.NewReader(nil), W: io.Discard}, hs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		err = c.(layer.EarlyConn).Handshake()
		if err == nil || len(ff.sent) != headerSize+dhLen+len("request")+tagSize {
			t.Fatalf("handshake: %v, first message %d bytes; want an error, and the request in the message", err, len(ff.sent))
		}
		if len(ff.learnt) != 1 || ff.learnt[0] {
			t.Fatalf("TakesEarly calls %v, want [false]", ff.learnt)
		}
		if err2 := c.(layer.EarlyConn).Handshake(); err2 != err {
			t.Fatalf("a second Handshake: %v, want the first's %v", err2, err)
		}
	})
}

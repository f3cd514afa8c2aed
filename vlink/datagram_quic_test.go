package vlink_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/quic"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// Over a stack whose bottom is quic, straight to the gateway, a datagram
// session asks for QUIC datagrams (Hello.QUICDatagrams), whatever
// filters ride the stream; datagrams of every size come back whole,
// those past a packet over the stream. Over a multi-link layer, or
// another transport, it does not ask.
func TestQUICDatagrams(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	echo := testnet.UDPEcho(t).String()
	for _, tc := range []struct {
		stack string
		key   []byte
		quic  bool // QUIC datagrams expected
	}{
		{"quic", nil, true},
		{"zstd+quic", nil, true},
		{"noise+quic", key, true},
		{"zstd+mux+quic", nil, false},
		{"tcp", nil, false},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			hellos := make(chan *vlink.Hello, 1)
			gw := datagramGatewayOn(t, vlink.ListenConfig{Policy: vlink.Policy{Key: tc.key, Datagrams: loopbackDatagrams}, Quic: true}, hellos)
			d := vlink.Dialer{Stack: vlink.MustParse(tc.stack), Via: gw, Key: tc.key}
			defer d.Close()
			c, err := d.Dial("udp", echo)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			echoesWhole(t, c, 0, 1, 512, 1100, 1472, 4000, 60000, 3)
			if h := <-hellos; h.QUICDatagrams != tc.quic {
				t.Errorf("Hello.QUICDatagrams %v, want %v", h.QUICDatagrams, tc.quic)
			}
			// A read deadline still holds with nothing to read.
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := c.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("read with nothing sent: %v, want a timeout", err)
			}
		})
	}
}

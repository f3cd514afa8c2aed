package vlink

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/selector"
)

// A listener from before datagram sessions refuses their hello as
// malformed (an unknown field): the dialer says to upgrade it.
func TestDatagramsOldListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var m [len(magic)]byte
		io.ReadFull(c, m[:])
		readFrame(c, msgHello)
		sendRefusal(c, refuse(CodeMalformed, "malformed handshake: hello: unknown field 16"))
	}()
	d := &Dialer{Stack: MustParse("tcp"), Via: ln.Addr().String()}
	_, err = d.Dial("udp", "127.0.0.1:53")
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "upgrade it") {
		t.Fatalf("dial: %v, want a refusal that says to upgrade the gateway", err)
	}
}

// The datagram field is the byte 1 (frames on the stream) or 2 (QUIC
// datagrams too); any other value is a malformed hello.
func TestDatagramField(t *testing.T) {
	for _, m := range []*message{
		{typ: msgHello, target: "h:1", dgram: true},
		{typ: msgHello, target: "h:1", dgram: true, qdgram: true},
	} {
		b := m.appendFrame(nil)
		got, err := decodeBody(msgHello, b[headerSize:])
		if err != nil || got.dgram != m.dgram || got.qdgram != m.qdgram {
			t.Fatalf("%+v decoded as %+v, %v", m, got, err)
		}
	}
	for _, v := range []byte{0, 3, 255} {
		b := (&message{typ: msgHello, target: "h:1", dgram: true}).appendFrame(nil)
		b[len(b)-1] = v
		if _, err := decodeBody(msgHello, b[headerSize:]); !errors.Is(err, ErrBadHello) {
			t.Errorf("datagram field %d: %v, want ErrBadHello", v, err)
		}
	}
}

// A hello that asks for QUIC datagrams on a connection without them (a
// TCP one here; the dialer asks only on a quic stream straight to the
// listener) is refused cleanly, not left to lose its datagrams.
func TestQUICDatagramsRefusedWithoutCarrier(t *testing.T) {
	lc := ListenConfig{Policy: Policy{Datagrams: []selector.Rule{{Host: "127.0.0.1", Ports: "*", Action: selector.Direct}}}}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _, err = clientHandshake(c, &message{typ: msgHello, target: "127.0.0.1:53", dgram: true, qdgram: true}, nil, nil)
	var re *RefusedError
	if !errors.As(err, &re) || re.Code != CodeLayer || !strings.Contains(err.Error(), "QUIC datagrams") {
		t.Fatalf("handshake: %v, want a layer refusal naming QUIC datagrams", err)
	}
}

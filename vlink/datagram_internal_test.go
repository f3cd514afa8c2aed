package vlink

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
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

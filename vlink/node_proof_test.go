package vlink

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

var testNetworkKey = []byte("0123456789abcdef-network-key")

// fakeListener answers one hello as a listener holding serverKey would,
// but with no checks: it proves whatever prove returns. It reports the
// hello it read.
func fakeListener(t *testing.T, prove func(helloBody, nonce []byte, m *message) []byte) (string, <-chan *message) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hellos := make(chan *message, 1)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var mg [len(magic)]byte
		if _, err := io.ReadFull(c, mg[:]); err != nil {
			return
		}
		m, helloBody, err := readFrame(c, msgHello)
		if err != nil {
			return
		}
		hellos <- m
		nonce := bytes.Repeat([]byte{9}, nonceSize)
		c.Write((&message{typ: msgChallenge, nonce: nonce}).appendFrame(nil))
		if _, _, err := readFrame(c, msgAuth); err != nil {
			return
		}
		c.Write((&message{typ: msgAccept, proof: prove(helloBody, nonce, m)}).appendFrame(nil))
		io.Copy(io.Discard, c)
	}()
	return ln.Addr().String(), hellos
}

// A node's dialer checks the listener's proof against its node key: a
// listener that proves with anything else is refused, so a node never
// talks to an impostor of its network.
func TestNodeChecksListenerProof(t *testing.T) {
	alice := NodeKey(testNetworkKey, "alice")
	tests := []struct {
		name  string
		proof func(helloBody, nonce []byte, m *message) []byte
		ok    bool
	}{
		{"node key", func(b, n []byte, m *message) []byte {
			return proof(NodeKey(testNetworkKey, m.node), labelServer, b, n, nil)
		}, true},
		{"network key", func(b, n []byte, m *message) []byte { return proof(testNetworkKey, labelServer, b, n, nil) }, false},
		{"another network", func(b, n []byte, m *message) []byte {
			return proof(NodeKey([]byte("another network key, 16+ bytes"), m.node), labelServer, b, n, nil)
		}, false},
		{"another node", func(b, n []byte, m *message) []byte {
			return proof(NodeKey(testNetworkKey, "bob"), labelServer, b, n, nil)
		}, false},
		{"the dialer's own proof", func(b, n []byte, m *message) []byte { return proof(alice, labelClient, b, n, nil) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, hellos := fakeListener(t, tt.proof)
			d := Dialer{Stack: MustParse("test-xor"), Node: "alice", Key: alice}
			c, err := d.Dial("tcp", addr)
			if m := <-hellos; m.node != "alice" || m.nonce == nil {
				t.Fatalf("the hello names node %q with nonce %x, want alice and a nonce", m.node, m.nonce)
			}
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, ErrAuth) || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "could not prove") {
				t.Fatalf("err = %v, want ErrAuth from the dialer's own check", err)
			}
		})
	}
}

// A hello that names a node but carries no nonce (so proves no key) is
// refused, as is a name to a listener without the network key.
func TestNodeHelloWithoutProof(t *testing.T) {
	tests := []struct {
		name    string
		policy  Policy
		hello   *message
		code    RefuseCode
		mention string
	}{
		{"no nonce", Policy{Key: testNetworkKey}, &message{typ: msgHello, stack: "test-xor", node: "alice"}, CodeAuthRequired, "proves no key"},
		{"keyless listener", Policy{}, &message{typ: msgHello, stack: "test-xor", node: "alice", nonce: make([]byte, nonceSize)}, CodeAuthRequired, "needs a listener key"},
		{"keyless listener, no nonce", Policy{}, &message{typ: msgHello, stack: "test-xor", node: "alice"}, CodeAuthRequired, "takes no name on trust"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lc := ListenConfig{Policy: tt.policy}
			l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(tt.hello.appendFrame([]byte(magic)))
			m, _, err := readFrame(c, msgRefuse, msgChallenge, msgAccept)
			if err != nil {
				t.Fatal(err)
			}
			if m.typ != msgRefuse || m.code != tt.code || !strings.Contains(m.reason, tt.mention) {
				t.Fatalf("answer %s %v %q, want a refusal %v mentioning %q", m.typ, m.code, m.reason, tt.code, tt.mention)
			}
		})
	}
}

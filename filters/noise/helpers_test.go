package noise

import (
	"bytes"
	"net"
	"testing"

	flynn "github.com/flynn/noise"
	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	testKey        = []byte("0123456789abcdef-test-key")
	testTranscript = []byte("\x89VLK\r\n\x1a\n hello, challenge, auth, accept")
)

// pair runs the handshake between a and b and returns the two ends.
func pair(tb testing.TB, a, b net.Conn) (client, server net.Conn) {
	return pairWith(tb, a, b, layer.AEADDefault)
}

// pairWith is pair with the cipher a hello agreed on.
func pairWith(tb testing.TB, a, b net.Conn, aead layer.AEAD) (client, server net.Conn) {
	tb.Helper()
	hs := layer.Handshake{Key: testKey, Transcript: testTranscript, AEAD: aead}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := Filter{}.ServerHandshake(b, hs)
		ch <- res{c, err}
	}()
	client, err := Filter{}.ClientHandshake(a, hs)
	r := <-ch
	if err != nil || r.err != nil {
		tb.Fatalf("handshake: client %v, server %v", err, r.err)
	}
	return client, r.c
}

// states returns the two ends of one direction, as a handshake leaves
// them, under a fixed key, for hand-made streams.
func states() (send, recv *cipherState) { return statesOf(layer.AEADChaChaPoly) }

// statesOf is states with another cipher.
func statesOf(aead layer.AEAD) (send, recv *cipherState) {
	k := [32]byte{1, 2, 3}
	s, _ := newCipherState(flynn.UnsafeNewCipherState(suite, k, 0), aead)
	r, _ := newCipherState(flynn.UnsafeNewCipherState(suite, k, 0), aead)
	return s, r
}

// encode returns the wire form of the given writes, followed by the end
// record if end is set, and a reader's cipher state for it.
func encode(tb testing.TB, end bool, writes ...[]byte) (wire []byte, recv *cipherState) {
	tb.Helper()
	var buf bytes.Buffer
	send, recv := states()
	c := newConn(&testnet.FakeConn{W: &buf}, send, nil)
	for _, w := range writes {
		if _, err := c.Write(w); err != nil {
			tb.Fatal(err)
		}
	}
	if end {
		if err := c.CloseWrite(); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes(), recv
}

// records splits a wire stream into its records.
func records(wire []byte) [][]byte {
	var out [][]byte
	for len(wire) >= headerSize {
		n := headerSize + (*header)(wire).Len()
		out = append(out, wire[:n])
		wire = wire[n:]
	}
	return out
}

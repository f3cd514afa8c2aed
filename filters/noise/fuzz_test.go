package noise

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// FuzzRecords feeds the record reader streams made from a real one by
// the fuzzer. Only authentic records may come out, so whatever it reads
// must be a prefix of what was sent, and it ends in io.EOF only if the
// stream was whole.
func FuzzRecords(f *testing.F) {
	// Small records keep each run fast; their sizes do not matter to
	// the decoder's logic.
	sent := bytes.Repeat([]byte("0123456789"), 300)
	wire, _ := encode(f, true, sent[:10], sent[10:2000], sent[2000:])
	f.Add(wire)
	f.Add(wire[:len(wire)/2])
	f.Add([]byte{})
	f.Add([]byte{byte(recData), 0xff, 0xff})
	f.Add([]byte{byte(recEnd), 0, tagSize})
	recs := records(wire)
	f.Add(append(bytes.Clone(recs[1]), recs[0]...))
	f.Fuzz(func(t *testing.T, in []byte) {
		_, recv := states()
		c := newConn(&testnet.FakeConn{R: bytes.NewReader(in)}, nil, recv)
		var got []byte
		buf := make([]byte, 1000)
		var err error
		for err == nil {
			var n int
			n, err = c.Read(buf)
			got = append(got, buf[:n]...)
		}
		if !bytes.HasPrefix(sent, got) {
			t.Fatalf("read %d bytes that were not sent", len(got))
		}
		if err == io.EOF && !bytes.Equal(got, sent) {
			t.Fatalf("clean end after %d of %d bytes", len(got), len(sent))
		}
		if err != io.EOF && !errors.Is(err, ErrAuth) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// FuzzHandshake answers each side's handshake with bytes of the
// fuzzer's: neither may complete with a forged message, nor panic.
func FuzzHandshake(f *testing.F) {
	f.Add([]byte{byte(recHandshake), 0, 48}, false)
	f.Add(append([]byte{byte(recHandshake), 0, 48}, make([]byte, 48)...), true)
	f.Add([]byte{byte(recHandshake), 0xff, 0xff}, true)
	f.Fuzz(func(t *testing.T, in []byte, initiator bool) {
		hs := layer.Handshake{Key: testKey, Transcript: testTranscript}
		c := &testnet.FakeConn{R: bytes.NewReader(in)}
		var err error
		var nc net.Conn
		if initiator {
			nc, err = Filter{}.ClientHandshake(c, hs)
		} else {
			nc, err = Filter{}.ServerHandshake(c, hs)
		}
		if initiator && err == nil {
			t.Fatal("the initiator accepted a forged answer")
		}
		if nc != nil {
			nc.(*conn).Abort()
		}
		// A responder cannot tell a replayed first message from a fresh
		// one (NNpsk0), but random bytes never decrypt.
		if !initiator && err == nil && len(in) < headerSize+48 {
			t.Fatal("the responder accepted a short first message")
		}
	})
}

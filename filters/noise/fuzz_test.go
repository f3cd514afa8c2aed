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

// FuzzFirstMessage gives the responder a first message that came with
// the hello (layer.Handshake.First), made by the fuzzer: a forged one
// never completes the handshake, and the data of a genuine one are the
// stream's first bytes only when the listener takes early data
// (layer.Handshake.Early); else they are dropped, and the answer says so.
func FuzzFirstMessage(f *testing.F) {
	genuine, withData := firstMessage(f, nil), firstMessage(f, []byte("early"))
	f.Add(genuine, false)
	f.Add(withData, true)
	f.Add(withData, false)
	f.Add(append([]byte{byte(recHandshake), 0, 48}, make([]byte, 48)...), true)
	f.Add([]byte{byte(recHandshake), 0xff, 0xff}, true)
	f.Add([]byte{byte(recData), 0, 0}, false)
	f.Fuzz(func(t *testing.T, in []byte, early bool) {
		hs := layer.Handshake{Key: testKey, Transcript: testTranscript, First: in, Early: early}
		var out bytes.Buffer
		nc, err := Filter{}.ServerHandshake(&testnet.FakeConn{R: bytes.NewReader(nil), W: &out}, hs)
		if err != nil {
			if out.Len() > 0 {
				t.Fatalf("the responder answered a first message it refused: %v", err)
			}
			return
		}
		defer nc.(*conn).Abort()
		if !bytes.Equal(in, genuine) && !bytes.Equal(in, withData) {
			t.Fatalf("the responder took a first message of %d bytes it was not sent", len(in))
		}
		var want []byte
		if early && bytes.Equal(in, withData) {
			want = []byte("early")
		}
		if got := nc.(*conn).plain; !bytes.Equal(got, want) {
			t.Fatalf("the stream starts with %q, want %q", got, want)
		}
	})
}

// firstMessage returns an initiator's first message under testKey and
// testTranscript, as a record, carrying payload, always the same.
func firstMessage(tb testing.TB, payload []byte) []byte {
	tb.Helper()
	// A fixed ephemeral key: each fuzzing process makes the same.
	st, _, err := newState(layer.Handshake{Key: testKey, Transcript: testTranscript}, true, bytes.NewReader(make([]byte, 64)))
	if err != nil {
		tb.Fatal(err)
	}
	msg, _, _, err := st.WriteMessage(nil, payload)
	if err != nil {
		tb.Fatal(err)
	}
	rec := make([]byte, headerSize, headerSize+len(msg))
	(*header)(rec).set(recHandshake, len(msg))
	return append(rec, msg...)
}

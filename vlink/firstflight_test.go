package vlink

import (
	"bytes"
	"net"
	"testing"
)

// firstFlightListener is a keyed listener's side of the mark check, with
// no accept loop.
func firstFlightListener(key []byte) *Listener {
	return &Listener{cfg: ListenConfig{Policy: Policy{Key: key}}}
}

func TestFirstFlightMark(t *testing.T) {
	key, other := []byte("the network key"), []byte("another key")
	local := &net.TCPConn{} // not Vouched
	for _, tc := range []struct {
		name  string
		hello message
		sign  []byte // the dialer's key; nil: no nonce at all
		want  bool
	}{
		{"the listener's key", message{stack: "zstd", target: "db:5432"}, key, true},
		{"a node's key", message{stack: "noise", node: "alice"}, NodeKey(key, "alice"), true},
		{"the network key for a named node", message{stack: "noise", node: "alice"}, key, false},
		{"another key", message{stack: "zstd"}, other, false},
		{"no key", message{stack: "zstd"}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := helloBytes(&tc.hello, tc.sign)
			if got := firstFlightListener(key).markedFirstFlight(local, b); got != tc.want {
				t.Errorf("marked = %v, want %v", got, tc.want)
			}
			if got := firstFlightListener(key).markedFirstFlight(local, b[:len(b)-1]); got {
				t.Error("a hello cut short is marked")
			}
		})
	}
	t.Run("any byte changed", func(t *testing.T) {
		b := helloBytes(&message{stack: "zstd", target: "db:5432"}, key)
		for i := len(magic) + headerSize; i < len(b); i++ {
			c := bytes.Clone(b)
			c[i] ^= 0x40
			if firstFlightListener(key).markedFirstFlight(local, c) {
				t.Fatalf("still marked with byte %d changed", i)
			}
		}
	})
	t.Run("a random nonce, as before marks", func(t *testing.T) {
		b := helloBytes(&message{stack: "zstd"}, key)
		at := len(magic) + headerSize + markAt(b[len(magic)+headerSize:])
		copy(b[at:], bytes.Repeat([]byte{0x5a}, markSize))
		if firstFlightListener(key).markedFirstFlight(local, b) {
			t.Fatal("a hello with a random nonce is marked")
		}
	})
}

// FuzzFirstFlight: the mark check never panics on what a socket holds,
// and a hello passes it only if its mark is the key's.
func FuzzFirstFlight(f *testing.F) {
	key := []byte("the network key")
	f.Add(helloBytes(&message{stack: "zstd", target: "db:5432"}, key))
	f.Add(helloBytes(&message{stack: "noise", node: "alice"}, key))
	f.Add([]byte(magic + "\x01\x01\x00\x04\x03\x00\x01z"))
	f.Fuzz(func(t *testing.T, b []byte) {
		l := firstFlightListener(key)
		if !l.markedFirstFlight(&net.TCPConn{}, b) {
			return
		}
		body := b[len(magic)+headerSize : len(magic)+headerSize+header(b[len(magic):]).Len()]
		m, err := decodeBody(msgHello, body)
		if err != nil {
			t.Fatalf("marked, but the hello does not decode: %v", err)
		}
		k := key
		if m.node != "" {
			k = NodeKey(key, m.node)
		}
		at := markAt(body)
		if !bytes.Equal(body[at:at+markSize], mark(k, body, at)) {
			t.Fatal("marked without the key's mark")
		}
	})
}

package vlink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestFrameRoundTrip(t *testing.T) {
	msgs := []*message{
		{typ: msgHello, stack: "zstd:level=3", target: "db.internal:5432", nonce: bytes.Repeat([]byte{7}, nonceSize)},
		{typ: msgHello},
		{typ: msgHello, stack: "noise", node: "alice", nonce: bytes.Repeat([]byte{3}, nonceSize)},
		{typ: msgChallenge, nonce: bytes.Repeat([]byte{1}, nonceSize)},
		{typ: msgAuth, proof: bytes.Repeat([]byte{2}, proofSize)},
		{typ: msgAccept},
		{typ: msgAccept, proof: bytes.Repeat([]byte{4}, proofSize), static: bytes.Repeat([]byte{5}, identitySize)},
		{typ: msgRefuse, code: CodeParam, reason: "zstd level 22 is outside [1, 9]\nsecond line"},
		{typ: msgHello, hops: []string{"gw2.example:7000", "[fd00::1]:7000"}, trail: bytes.Repeat([]byte{9}, 2*trailIDSize), origin: "192.0.2.1:5555"},
		{typ: msgRefuse, code: CodeLoop, reason: "round", hop: 3},
		{typ: msgHello, stack: "zstd", target: "db.internal:0", lookup: true},
		{typ: msgAccept, proof: bytes.Repeat([]byte{4}, proofSize), family: FamilyIPv4},
		{typ: msgHello, stack: "zstd", target: "db.internal:5432", cc: "bbr"},
		{typ: msgHello, stack: "zstd", target: "db.internal:5432", wait: 127000},
		{typ: msgHello, stack: "noise", nonce: bytes.Repeat([]byte{3}, nonceSize), first: &firstField{time: 1 << 40, aead: layer.AEADAESGCM, length: 51}},
		{typ: msgHello, stack: "noise", nonce: bytes.Repeat([]byte{3}, nonceSize), first: &firstField{time: 7, length: maxFirstMessage, static: bytes.Repeat([]byte{5}, identitySize)}},
	}
	for _, m := range msgs {
		t.Run(m.typ.String(), func(t *testing.T) {
			b := m.appendFrame(nil)
			got, _, err := readFrame(bytes.NewReader(b), m.typ)
			if err != nil {
				t.Fatal(err)
			}
			if got.stack != m.stack || got.target != m.target || got.node != m.node || !bytes.Equal(got.nonce, m.nonce) ||
				!bytes.Equal(got.proof, m.proof) || got.code != m.code || got.reason != m.reason ||
				strings.Join(got.hops, ",") != strings.Join(m.hops, ",") || got.origin != m.origin || !bytes.Equal(got.trail, m.trail) || got.hop != m.hop ||
				got.lookup != m.lookup || got.family != m.family || got.wait != m.wait ||
				(got.first == nil) != (m.first == nil) || got.first != nil && (got.first.time != m.first.time || got.first.aead != m.first.aead ||
				got.first.length != m.first.length || !bytes.Equal(got.first.static, m.first.static)) {
				t.Fatalf("got %+v, want %+v", got, m)
			}
		})
	}
}

func TestFrameErrors(t *testing.T) {
	hello := func(body []byte) []byte {
		b := []byte{protoVersion, byte(msgHello), 0, 0}
		binary.BigEndian.PutUint16(b[2:], uint16(len(body)))
		return append(b, body...)
	}
	field := func(tag fieldTag, v []byte) []byte {
		b := []byte{byte(tag), 0, 0}
		binary.BigEndian.PutUint16(b[1:], uint16(len(v)))
		return append(b, v...)
	}
	tests := []struct {
		name    string
		in      []byte
		is      error
		mention string
	}{
		{"version", []byte{2, 1, 0, 0}, ErrBadHello, "version 2"},
		{"wrong type", []byte{1, byte(msgAccept), 0, 0}, ErrBadHello, "got accept"},
		{"oversized", []byte{1, 1, 0xff, 0xff}, ErrBadHello, "exceeds"},
		{"truncated body", []byte{1, 1, 0, 10, 1}, io.ErrUnexpectedEOF, ""},
		{"truncated field", hello([]byte{1, 0}), ErrBadHello, "truncated field"},
		{"field too long", hello([]byte{1, 0, 9, 'a'}), ErrBadHello, "claims 9 bytes"},
		{"unknown field", hello(field(99, []byte("x"))), ErrBadHello, "unexpected field 99"},
		{"field not for hello", hello(field(tagProof, make([]byte, proofSize))), ErrBadHello, "unexpected field 4"},
		{"repeated", hello(append(field(tagStack, []byte("a")), field(tagStack, []byte("b"))...)), ErrBadHello, "repeated"},
		{"short nonce", hello(field(tagNonce, []byte{1})), ErrBadHello, "nonce is 1 bytes"},
		{"empty stack", hello(field(tagStack, nil)), ErrBadHello, "stack is 0 bytes"},
		{"long target", hello(field(tagTarget, bytes.Repeat([]byte{'a'}, 300))), ErrBadHello, "target is 300 bytes"},
		{"not utf8", hello(field(tagTarget, []byte{0xff, ':', '1'})), ErrBadHello, "not UTF-8"},
		{"control char", hello(field(tagStack, []byte("tcp\n"))), ErrBadHello, "control character"},
		{"empty node", hello(field(tagNode, nil)), ErrBadHello, "node is 0 bytes"},
		{"long node", hello(field(tagNode, bytes.Repeat([]byte{'a'}, 64))), ErrBadHello, "node is 64 bytes"},
		{"bad node", hello(field(tagNode, []byte("Alice"))), ErrBadHello, `"Alice"`},
		{"node ends in dash", hello(field(tagNode, []byte("a-"))), ErrBadHello, "invalid node name"},
		{"hop without port", hello(field(tagHops, []byte("gw:7000,gw2"))), ErrBadHello, `hop "gw2"`},
		{"hop named twice", hello(field(tagHops, []byte("gw:7000,gw:7000"))), ErrBadHello, "named twice"},
		{"too many hops", hello(field(tagHops, []byte("a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1"))), ErrBadHello, "9 hops"},
		{"empty hop", hello(field(tagHops, []byte("a:1,"))), ErrBadHello, `hop ""`},
		{"origin not an address", hello(field(tagOrigin, []byte("gw.example:80"))), ErrBadHello, "origin"},
		{"ragged trail", hello(field(tagTrail, make([]byte, trailIDSize+1))), ErrBadHello, "trail is 9 bytes"},
		{"long trail", hello(field(tagTrail, make([]byte, (MaxHops+1)*trailIDSize))), ErrBadHello, "trail is 72 bytes"},
		{"static key in a hello", hello(field(tagStatic, make([]byte, identitySize))), ErrBadHello, "unexpected field 12"},
		{"lookup not 1", hello(field(tagLookup, []byte{2})), ErrBadHello, "lookup must be"},
		{"family in a hello", hello(field(tagFamily, []byte{1})), ErrBadHello, "unexpected field 14"},
		{"cc not a name", hello(field(tagCC, []byte("bbr; rm"))), ErrBadHello, "congestion control must be"},
		{"cc too long", hello(field(tagCC, []byte("sixteen-letters!"))), ErrBadHello, "congestion control must be"},
		{"empty cipher offer", hello(field(tagAEAD, nil)), ErrBadHello, "cipher offer holds 1..8"},
		{"cipher offer too long", hello(field(tagAEAD, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})), ErrBadHello, "cipher offer holds 1..8"},
		{"cipher offered twice", hello(field(tagAEAD, []byte{2, 1, 2})), ErrBadHello, "distinct non-zero"},
		{"cipher zero", hello(field(tagAEAD, []byte{0})), ErrBadHello, "distinct non-zero"},
		{"wait zero", hello(field(tagWait, []byte{0, 0, 0, 0})), ErrBadHello, "wait must be"},
		{"wait short", hello(field(tagWait, []byte{1, 0})), ErrBadHello, "wait must be"},
		{"first short", hello(field(tagFirst, []byte{1})), ErrBadHello, "first is 1 bytes"},
		{"first of no length", hello(field(tagFirst, make([]byte, firstFieldSize))), ErrBadHello, "announces 0 bytes"},
		{"first too long", hello(field(tagFirst, []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 3})), ErrBadHello, "announces 65539 bytes"},
		{"first of an unknown cipher", hello(field(tagFirst, []byte{0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 51})), ErrBadHello, "cipher 9"},
		{"first with a short static key", hello(field(tagFirst, make([]byte, firstFieldSize+5))), ErrBadHello, "want 13 or 45"},
		{"a field newer than first", hello(field(tagFirst+1, []byte{1})), ErrBadHello, "newer than this side"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := readFrame(bytes.NewReader(tt.in), msgHello)
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("readFrame = %v, want %v mentioning %q", err, tt.is, tt.mention)
			}
		})
	}
}

// TestAcceptCipher: an accept chooses one cipher it knows.
func TestAcceptCipher(t *testing.T) {
	for _, v := range [][]byte{nil, {3}, {1, 2}, {0}} {
		b := []byte{protoVersion, byte(msgAccept), 0, byte(3 + len(v)), byte(tagAEAD), 0, byte(len(v))}
		_, _, err := readFrame(bytes.NewReader(append(b, v...)), msgAccept)
		if !errors.Is(err, ErrBadHello) || !strings.Contains(err.Error(), "chosen cipher") {
			t.Errorf("accept choosing %v: %v, want ErrBadHello about the chosen cipher", v, err)
		}
	}
	m, _, err := readFrame(bytes.NewReader((&message{typ: msgAccept, aeads: []byte{2}}).appendFrame(nil)), msgAccept)
	if err != nil || !bytes.Equal(m.aeads, []byte{2}) {
		t.Errorf("accept choosing AES-256-GCM: %v, %v", m, err)
	}
}

// FuzzReadFrame feeds arbitrary bytes to the handshake decoder: it must
// never panic, never read past one frame, and anything it accepts must
// encode back to the same frame.
func FuzzReadFrame(f *testing.F) {
	f.Add((&message{typ: msgHello, stack: "zstd", target: "h:1", nonce: make([]byte, nonceSize)}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "noise", node: "alice-2", nonce: make([]byte, nonceSize)}).appendFrame(nil))
	f.Add((&message{typ: msgHello, node: "Bad.Name"}).appendFrame(nil))
	f.Add((&message{typ: msgRefuse, code: CodeAuthFailed, reason: "no"}).appendFrame(nil))
	f.Add((&message{typ: msgHello, hops: []string{"a:1", "[::1]:2"}, trail: make([]byte, trailIDSize), origin: "[::1]:9"}).appendFrame(nil))
	f.Add((&message{typ: msgRefuse, code: CodeLoop, hop: 2}).appendFrame(nil))
	f.Add((&message{typ: msgAccept, static: make([]byte, identitySize)}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "zstd", target: "h:0", lookup: true}).appendFrame(nil))
	f.Add((&message{typ: msgAccept, family: FamilyIPv4 | FamilyIPv6, proof: make([]byte, proofSize)}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "noise", cert: bytes.Repeat([]byte{7}, 300)}).appendFrame(nil))
	f.Add((&message{typ: msgAccept, cert: []byte{1}}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "noise", aeads: []byte{2, 1, 77}}).appendFrame(nil))
	f.Add((&message{typ: msgAccept, aeads: []byte{2}}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "zstd", target: "h:1", wait: 15000}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "noise", nonce: make([]byte, nonceSize), first: &firstField{time: 1, aead: 2, length: 51}}).appendFrame(nil))
	f.Add((&message{typ: msgHello, stack: "noise", first: &firstField{length: 1, static: make([]byte, identitySize)}}).appendFrame(nil))
	f.Add([]byte{1, 1, 0, 3, 1, 0, 0})
	f.Add([]byte{1, 5, 0, 4, 5, 0, 1, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		m, body, err := readFrame(r, msgHello, msgChallenge, msgAuth, msgAccept, msgRefuse)
		if err != nil {
			return
		}
		consumed := len(in) - r.Len()
		if consumed != headerSize+len(body) {
			t.Fatalf("consumed %d bytes for a %d-byte body", consumed, len(body))
		}
		again, _, err := readFrame(bytes.NewReader(m.appendFrame(nil)), m.typ)
		if err != nil {
			t.Fatalf("re-encoded frame does not decode: %v", err)
		}
		if again.stack != m.stack || again.target != m.target || again.node != m.node || again.code != m.code || again.reason != m.reason ||
			strings.Join(again.hops, ",") != strings.Join(m.hops, ",") || again.origin != m.origin || !bytes.Equal(again.trail, m.trail) || again.hop != m.hop ||
			again.lookup != m.lookup || again.family != m.family || !bytes.Equal(again.cert, m.cert) || !bytes.Equal(again.aeads, m.aeads) ||
			again.wait != m.wait {
			t.Fatalf("re-encoding changed the message: %+v vs %+v", again, m)
		}
	})
}

// TestWholeHello: what a parked connection must have sent to be given a
// slot (see shedder).
func TestWholeHello(t *testing.T) {
	hello := append([]byte(magic), (&message{typ: msgHello, stack: "zstd"}).appendFrame(nil)...)
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"nothing", nil, false},
		{"part of the magic", []byte(magic[:3]), false},
		{"the magic", []byte(magic), false},
		{"half a hello", hello[:len(hello)-1], false},
		{"a hello", hello, true},
		{"a hello and more", append(hello, 1, 2, 3), true},
		{"a plain client", []byte("GET / HTTP/1.1\r\n"), true},
		{"one byte off the magic", []byte("\x89VLX"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := wholeHello(tc.b); got != tc.want {
				t.Errorf("wholeHello(%q) = %v, want %v", tc.b, got, tc.want)
			}
		})
	}
}

// FuzzWholeHello: wholeHello never panics, and says "not yet" only for
// the start of a hello: the magic's prefix, or the magic and a frame cut
// short.
func FuzzWholeHello(f *testing.F) {
	f.Add([]byte(magic + "\x01\x01\x00\x04\x01\x00\x01z"))
	f.Add([]byte(magic + "\x01\x01\xff\xff"))
	f.Add([]byte("SSH-2.0-"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if wholeHello(b) {
			return
		}
		m := min(len(b), len(magic))
		if string(b[:m]) != magic[:m] {
			t.Fatalf("%q is no hello, but waits for more", b)
		}
		if len(b) >= len(magic)+headerSize {
			if n := header(b[len(magic):]).Len(); len(b) >= len(magic)+headerSize+n {
				t.Fatalf("%q holds a whole frame of %d bytes, but waits for more", b, n)
			}
		}
	})
}

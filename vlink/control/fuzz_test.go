package control

import (
	"bytes"
	"net/netip"
	"testing"
)

// FuzzFrame feeds arbitrary bytes to the control frame decoder: it must
// never panic, never read past one frame, never accept a body beyond its
// bound, and what it accepts must encode back to exactly the bytes read.
func FuzzFrame(f *testing.F) {
	seeds := []*frame{
		{op: opPing, payload: make([]byte, pingSize)},
		{op: opSend, typ: 1, coop: 7, name: "bob", payload: []byte("hi")},
		{op: opForward, typ: 1, coop: 7, name: "carol", name2: "alice"},
		{op: opDeliver, typ: 9, name: "alice", name2: "bob", payload: []byte{0}},
		{op: opError, coop: 3, code: CodeBusy, name: "bob", reason: "full"},
		{op: opLookup, coop: 1, name: "x"},
		{op: opPeer, coop: 1, name: "x", online: true, addrs: []netip.AddrPort{netip.MustParseAddrPort("[2001:db8::1]:80"), netip.MustParseAddrPort("10.0.0.1:1")}},
		{op: opWelcome, addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}},
		{op: opAdvertise},
		{op: opDial, coop: 5, token: [tokenSize]byte{1}, key: make([]byte, keySize), port: 22, flags: flagNoRelay, name: "bob",
			addrs: []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:7200")}},
		{op: opOffer, token: [tokenSize]byte{2}, key: make([]byte, keySize), port: 22, name: "alice"},
		{op: opDecline, token: [tokenSize]byte{3}, code: CodeUnreachable, reason: "could not connect back"},
		{op: opReady, coop: 5, token: [tokenSize]byte{4}, key: make([]byte, keySize)},
		{op: opAttach, token: [tokenSize]byte{5}},
		{op: opAttached},
		{op: opDial, coop: 6, token: [tokenSize]byte{6}, key: make([]byte, keySize), port: 22, flags: flagSplice, name: "bob",
			splice: netip.MustParseAddrPort("0.0.0.0:40000")},
		{op: opOffer, token: [tokenSize]byte{7}, key: make([]byte, keySize), port: 22, flags: flagSplice | flagNoRelay, name: "alice",
			splice: netip.MustParseAddrPort("192.0.2.1:40000")},
		{op: opPunch, token: [tokenSize]byte{8}, splice: netip.MustParseAddrPort("[2001:db8::2]:40001")},
		{op: opSync, token: [tokenSize]byte{9}},
		{op: opLink, addrs: []netip.AddrPort{netip.MustParseAddrPort("[::]:7100")}},
		{op: opJoined, name: "bob", addrs: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.0.0.2:7200")}},
		{op: opLeft, name: "bob"},
		{op: opVia, name: "bob", payload: (&frame{op: opDeliver, typ: 3, coop: 1, name: "alice", payload: []byte("hi")}).append(nil)},
		{op: opVia, name: "bob", payload: (&frame{op: opOffer, token: [tokenSize]byte{10}, key: make([]byte, keySize), port: 22, name: "alice"}).append(nil)},
		{op: opFrom, name: "bob", payload: (&frame{op: opPunch, token: [tokenSize]byte{11}, splice: netip.MustParseAddrPort("192.0.2.7:40001")}).append(nil)},
		{op: opFrom, name: "bob", payload: (&frame{op: opSend, typ: 1, name: "carol"}).append(nil)}, // not passed on
	}
	for _, s := range seeds {
		f.Add(s.append(nil))
	}
	f.Add([]byte{1, 3, 0, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 8, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		fr, err := readFrame(r)
		if err != nil {
			return
		}
		consumed := in[:len(in)-r.Len()]
		if len(consumed) > headerSize+maxBody {
			t.Fatalf("accepted a %d-byte frame", len(consumed))
		}
		if again := fr.append(nil); !bytes.Equal(again, consumed) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, consumed)
		}
		if fr.op == opVia || fr.op == opFrom {
			in, err := fr.unwrap()
			if err != nil {
				return
			}
			if in.op == opVia || in.op == opFrom || in.op == opSend || in.op == opLink {
				t.Fatalf("%s passed on %s", fr.op, in.op)
			}
			if again := in.append(nil); !bytes.Equal(again, fr.payload) {
				t.Fatalf("re-encoding the frame %s carries differs:\n got %x\nwant %x", fr.op, again, fr.payload)
			}
		}
	})
}

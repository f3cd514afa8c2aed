package preload

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"testing"
)

func sampleRequests() []request {
	return []request{
		{typ: msgHello, pid: 4242, token: [tokenSize]byte{1, 2, 3, 15: 0xff}},
		{typ: msgConnect, connect: connectReq{dest: netip.MustParseAddrPort("10.1.2.3:443"), family: 4, mode: modeAsync}},
		{typ: msgConnect, connect: connectReq{dest: netip.MustParseAddrPort("[fd00::1]:22"), family: 6, mode: modeSync, timeoutMs: 1500}},
		{typ: msgConnect, connect: connectReq{dest: netip.MustParseAddrPort("10.1.2.3:443"), family: 4, mode: modeAsync, own: true}},
		{typ: msgAttach, attach: attachReq{token: 1<<40 + 7, local: netip.MustParseAddrPort("127.0.0.1:40000")}},
		{typ: msgResolve, resolve: resolveReq{port: 80, name: "far.example"}},
		{typ: msgPeer, addr: netip.MustParseAddrPort("127.0.0.1:50000")},
		{typ: msgAddrName, addr: netip.MustParseAddrPort("198.18.0.9:0")},
		{typ: msgWhy, why: 1<<40 + 9},
		{typ: msgListen, listen: listenReq{bound: netip.MustParseAddrPort("[::]:8080"), private: netip.MustParseAddrPort("[::1]:41000")}},
		{typ: msgAccepted, addr: netip.MustParseAddrPort("127.0.0.1:42000")},
		{typ: msgDatagram, dgram: datagramReq{dest: netip.MustParseAddrPort("198.18.0.9:53"), family: 4, local: netip.MustParseAddrPort("127.0.0.1:43000")}},
		{typ: msgDatagram, dgram: datagramReq{dest: netip.MustParseAddrPort("[fd00::1]:443"), family: 6, local: netip.MustParseAddrPort("[::1]:43001")}},
		{typ: msgAnswer, answer: sampleAnswer("10.1.2.3:443", false, "\x01\x05\x00\x02\x01\x03")},
		{typ: msgAnswer, answer: sampleAnswer("[fd00::1]:22", true, "")},
	}
}

func sampleAnswer(dest string, timedOut bool, b string) answerReq {
	m := answerReq{dest: netip.MustParseAddrPort(dest), timedOut: timedOut}
	m.n = uint16(copy(m.b[:], b))
	return m
}

func TestFrameRoundTrip(t *testing.T) {
	for _, want := range sampleRequests() {
		t.Run(want.typ.String(), func(t *testing.T) {
			wire := appendRequest(nil, &want)
			var buf [headerSize + maxBody]byte
			r := bytes.NewReader(append(wire, 0xee)) // a byte of the next frame
			typ, body, err := readFrame(r, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if r.Len() != 1 {
				t.Errorf("readFrame read %d bytes past the frame", 1-r.Len())
			}
			got, err := parseRequest(typ, body)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestFrameErrors(t *testing.T) {
	frame := func(v, typ byte, body []byte) []byte {
		return append([]byte{v, typ, byte(len(body) >> 8), byte(len(body))}, body...)
	}
	addr4 := appendAddr(nil, netip.MustParseAddrPort("10.0.0.1:1"))
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"short header", []byte{protoVersion, 3}, io.ErrUnexpectedEOF},
		{"version", frame(protoVersion+1, 1, []byte{0, 0, 0, 1}), ErrBadFrame},
		{"too long", []byte{protoVersion, 6, 0xff, 0xff}, ErrBadFrame},
		{"short body", []byte{protoVersion, 6, 0, 10, 'a'}, io.ErrUnexpectedEOF},
		{"unknown type", frame(protoVersion, 99, nil), ErrBadFrame},
		{"reply type from shim", frame(protoVersion, byte(msgResult), make([]byte, resultSize)), ErrBadFrame},
		{"hello size", frame(protoVersion, 1, []byte{1, 2, 3}), ErrBadFrame},
		{"hello without a token", frame(protoVersion, 1, []byte{0, 0, 0, 1}), ErrBadFrame},
		{"connect size", frame(protoVersion, 3, addr4), ErrBadFrame},
		{"connect family", frame(protoVersion, 3, append(append([]byte{}, addr4...), 5, 1, 0, 0, 0, 0)), ErrBadFrame},
		{"connect mode", frame(protoVersion, 3, append(append([]byte{}, addr4...), 4, 9, 0, 0, 0, 0)), ErrBadFrame},
		{"address family", frame(protoVersion, 8, append([]byte{7}, addr4[1:]...)), ErrBadFrame},
		{"IPv4 trailing bytes", frame(protoVersion, 8, func() []byte { b := append([]byte{}, addr4...); b[18] = 1; return b }()), ErrBadFrame},
		{"mapped as IPv6", frame(protoVersion, 8, appendAddr(nil, netip.AddrPortFrom(netip.MustParseAddr("::ffff:1.2.3.4"), 1))), ErrBadFrame},
		{"listen size", frame(protoVersion, byte(msgListen), addr4), ErrBadFrame},
		{"accepted size", frame(protoVersion, byte(msgAccepted), append(append([]byte{}, addr4...), 0)), ErrBadFrame},
		{"why size", frame(protoVersion, byte(msgWhy), []byte{0, 0, 0, 1}), ErrBadFrame},
		{"datagram size", frame(protoVersion, byte(msgDatagram), append(append([]byte{}, addr4...), 4)), ErrBadFrame},
		{"datagram family", frame(protoVersion, byte(msgDatagram), append(append(append([]byte{}, addr4...), 5), addr4...)), ErrBadFrame},
		{"datagram local of another family", frame(protoVersion, byte(msgDatagram), append(append(append([]byte{}, addr4...), 6), addr4...)), ErrBadFrame},
		{"resolve empty name", frame(protoVersion, 6, []byte{0, 80}), ErrBadFrame},
		{"resolve long name", frame(protoVersion, 6, append([]byte{0, 80}, bytes.Repeat([]byte("a"), 255)...)), ErrBadFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf [headerSize + maxBody]byte
			typ, body, err := readFrame(bytes.NewReader(tc.in), &buf)
			if err == nil {
				_, err = parseRequest(typ, body)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzRequest feeds the agent's decoder arbitrary bytes from a shim: it
// must never panic nor read past one frame, and whatever it accepts must
// encode back to the same bytes.
func FuzzRequest(f *testing.F) {
	for _, r := range sampleRequests() {
		f.Add(appendRequest(nil, &r))
	}
	f.Add([]byte{protoVersion, 6, 0, 3, 0, 80, 'x'})
	f.Add([]byte{protoVersion, 3, 0x02, 0x00})
	f.Add([]byte{protoVersion, 13, 0, 7, 1, 2, 3, 4, 5, 6, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		var buf [headerSize + maxBody]byte
		r := bytes.NewReader(data)
		typ, body, err := readFrame(r, &buf)
		if err != nil {
			return
		}
		if used := len(data) - r.Len(); used != headerSize+len(body) {
			t.Fatalf("read %d bytes for a frame of %d", used, headerSize+len(body))
		}
		req, err := parseRequest(typ, body)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v does not match ErrBadFrame", err)
			}
			return
		}
		if got := appendRequest(nil, &req); !bytes.Equal(got, data[:headerSize+len(body)]) {
			t.Fatalf("re-encoded %x, read %x", got, data[:headerSize+len(body)])
		}
	})
}

func TestWelcomeLayout(t *testing.T) {
	w := welcome{flags: welcomeIPsDirect, relay4: 1, relay6: 2, timeoutMs: 3, fake4: FakeIPv4, fake6: FakeIPv6, held4: 0x1234, held6: 0x5678}
	b := w.append(nil)
	if len(b) != welcomeSize {
		t.Fatalf("welcome is %d bytes, the shim reads %d", len(b), welcomeSize)
	}
	// The offsets the shim reads (ch_open in shim/vlink_preload.c).
	if b[16] != 15 || b[33] != 96 || !bytes.Equal(b[12:16], []byte{198, 18, 0, 0}) || b[17] != 0xfd ||
		!bytes.Equal(b[34:38], []byte{0x12, 0x34, 0x56, 0x78}) {
		t.Errorf("welcome layout: %x", b)
	}
	if n := len((&result{}).append(nil)); n != resultSize {
		t.Errorf("result is %d bytes, want %d", n, resultSize)
	}
	if n := len((&nameReply{}).append(nil)); n != nameSize {
		t.Errorf("name reply is %d bytes, want %d", n, nameSize)
	}
}

package jobwire

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	hello := Hello{Version: Version, Host: "node07", Task: 5}
	assign := Assign{Rank: 3, Size: 8, Relay: "127.0.0.1:4000", Key: bytes.Repeat([]byte{7}, 32), Env: []string{"OMP_NUM_THREADS=4", "EMPTY=", "LONG=" + strings.Repeat("x", 300)}}
	exit := Exit{Code: 0, Signal: 15}
	for _, f := range []struct {
		t Type
		p []byte
	}{{TypeHello, hello.Encode()}, {TypeAssign, assign.Encode()}, {TypeStdout, []byte("out\n")}, {TypeExit, exit.Encode()}, {TypeSignal, []byte{9}}} {
		if err := WriteFrame(&buf, f.t, f.p); err != nil {
			t.Fatal(err)
		}
	}
	read := func(want Type) []byte {
		t.Helper()
		f, err := ReadFrame(&buf)
		if err != nil || f.Type != want {
			t.Fatalf("ReadFrame: %v, %v; want a %v frame", f.Type, err, want)
		}
		return f.Payload
	}
	if h, err := DecodeHello(read(TypeHello)); err != nil || h != hello {
		t.Errorf("hello: %+v, %v", h, err)
	}
	if a, err := DecodeAssign(read(TypeAssign)); err != nil || a.Rank != 3 || a.Size != 8 || a.Relay != assign.Relay || !bytes.Equal(a.Key, assign.Key) || !slices.Equal(a.Env, assign.Env) {
		t.Errorf("assign: %+v, %v", a, err)
	}
	if p := read(TypeStdout); string(p) != "out\n" {
		t.Errorf("stdout: %q", p)
	}
	if e, err := DecodeExit(read(TypeExit)); err != nil || e != exit {
		t.Errorf("exit: %+v, %v", e, err)
	}
	if s, err := DecodeSignal(read(TypeSignal)); err != nil || s != 9 {
		t.Errorf("signal: %d, %v", s, err)
	}
	if _, err := ReadFrame(&buf); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
}

func TestMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"unknown type", []byte{0, 0, 0, 0, 0}, ErrFrame},
		{"type past the last", []byte{8, 0, 0, 0, 0}, ErrFrame},
		{"too long", []byte{3, 0, 1, 0, 1}, ErrFrame},
		{"cut in the header", []byte{3, 0}, io.ErrUnexpectedEOF},
		{"cut in the payload", []byte{3, 0, 0, 0, 4, 'a'}, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ReadFrame(bytes.NewReader(tc.raw)); !errors.Is(err, tc.want) {
				t.Errorf("ReadFrame: %v, want %v", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		p      []byte
	}{
		{"hello short", func(p []byte) error { _, err := DecodeHello(p); return err }, []byte{Version, 5, 'a'}},
		{"hello without its task", func(p []byte) error { _, err := DecodeHello(p); return err }, []byte{Version, 1, 'a', 'b'}},
		{"hello left over", func(p []byte) error { _, err := DecodeHello(p); return err }, []byte{Version, 1, 'a', 0, 0, 0, 1, 'b'}},
		{"assign rank past size", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{Rank: 4, Size: 4}.Encode()},
		{"assign size 0", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{}.Encode()},
		{"assign env not NAME=VALUE", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{Size: 1, Env: []string{"PATH"}}.Encode()},
		{"assign env without a name", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{Size: 1, Env: []string{"=x"}}.Encode()},
		{"assign env too large", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{Size: 1, Env: []string{"A=" + strings.Repeat("x", 20000), "B=" + strings.Repeat("x", 20000)}}.Encode()},
		{"assign env cut", func(p []byte) error { _, err := DecodeAssign(p); return err }, Assign{Size: 1, Env: []string{"A=1"}}.Encode()[:15]},
		{"exit short", func(p []byte) error { _, err := DecodeExit(p); return err }, []byte{1}},
		{"signal 0", func(p []byte) error { _, err := DecodeSignal(p); return err }, []byte{0}},
		{"signal 65", func(p []byte) error { _, err := DecodeSignal(p); return err }, []byte{65}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.decode(tc.p); !errors.Is(err, ErrFrame) {
				t.Errorf("decode: %v, want ErrFrame", err)
			}
		})
	}
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, TypeAssign, Assign{Rank: 1, Size: 2, Relay: "h:1", Key: []byte("k"), Env: []string{"A=1"}}.Encode())
	f.Add(b.Bytes())
	f.Add([]byte{1, 0, 0, 0, 3, 1, 1, 'h'})
	f.Add([]byte{1, 0, 0, 0, 7, Version, 1, 'h', 0, 0, 0, 3})
	f.Add([]byte{5, 0, 0, 0, 2, 0, 9})
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := bytes.NewReader(raw)
		for {
			fr, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("a payload of %d bytes", len(fr.Payload))
			}
			switch fr.Type {
			case TypeHello:
				// One of this version encodes back; one of another
				// decodes to its version alone, for the message.
				h, err := DecodeHello(fr.Payload)
				if err == nil && h.Version == Version && !bytes.Equal(h.Encode(), fr.Payload) {
					t.Fatalf("hello %+v does not encode back to %x", h, fr.Payload)
				}
				if err == nil && h.Version != Version && (h != Hello{Version: fr.Payload[0]}) {
					t.Fatalf("hello of version %d decoded to %+v", fr.Payload[0], h)
				}
			case TypeAssign:
				if a, err := DecodeAssign(fr.Payload); err == nil && (!bytes.Equal(a.Encode(), fr.Payload) || a.Rank >= a.Size) {
					t.Fatalf("assign %+v from %x", a, fr.Payload)
				}
			case TypeExit:
				if e, err := DecodeExit(fr.Payload); err == nil && !bytes.Equal(e.Encode(), fr.Payload) {
					t.Fatalf("exit %+v from %x", e, fr.Payload)
				}
			case TypeSignal:
				if s, err := DecodeSignal(fr.Payload); err == nil && (s == 0 || s > 64) {
					t.Fatalf("signal %d", s)
				}
			}
		}
	})
}

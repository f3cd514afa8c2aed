package vlink

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/selector"
)

// quickListener is a listener with lc's policy, closed at the end of the
// test.
func quickListener(t testing.TB, lc ListenConfig) *Listener {
	t.Helper()
	if lc.Policy.Targets == nil {
		lc.Policy.Targets = []selector.Rule{{Host: "127.0.0.1", Ports: "1-1000", Action: selector.Direct}}
	}
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestQuickHello: the hellos a listener answers from their bytes alone
// are those its handshake would accept with nothing more to read or
// write; the others go the long way.
func TestQuickHello(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	plainAccept := (&message{typ: msgAccept}).appendFrame(nil)
	key := []byte("a pre-shared key, long enough")
	for _, tc := range []struct {
		name  string
		lc    ListenConfig
		b     []byte
		check func(t *testing.T, q *QuickHello)
	}{
		{name: "a tcp route's hello", b: helloBytes(&message{target: "127.0.0.1:80"}, nil),
			check: func(t *testing.T, q *QuickHello) {
				if q.Hello.Target != "127.0.0.1:80" || q.Hello.RemoteAddr != remote || q.Hello.Authenticated {
					t.Errorf("Hello: target %q, remote %v, authenticated %v", q.Hello.Target, q.Hello.RemoteAddr, q.Hello.Authenticated)
				}
			}},
		{name: "congestion control", b: helloBytes(&message{target: "127.0.0.1:80", cc: "reno"}, nil),
			check: func(t *testing.T, q *QuickHello) {
				if q.Hello.CongestionControl != "reno" {
					t.Errorf("CongestionControl %q, want reno", q.Hello.CongestionControl)
				}
			}},
		{name: "a program's connect timeout", lc: ListenConfig{MaxTargetWait: 2 * time.Minute},
			b: helloBytes(&message{target: "127.0.0.1:80", wait: 60_000}, nil),
			check: func(t *testing.T, q *QuickHello) {
				if q.Hello.TargetWait != time.Minute {
					t.Errorf("TargetWait %v, want 1m", q.Hello.TargetWait)
				}
				if d := time.Until(q.Deadline); d < 55*time.Second || d > time.Minute {
					t.Errorf("Deadline in %v, want the dialer's minute", d)
				}
			}},
		{name: "a wait beyond MaxTargetWait", lc: ListenConfig{MaxTargetWait: 20 * time.Second},
			b: helloBytes(&message{target: "127.0.0.1:80", wait: 60_000}, nil),
			check: func(t *testing.T, q *QuickHello) {
				if d := time.Until(q.Deadline); d < 15*time.Second || d > 20*time.Second {
					t.Errorf("Deadline in %v, want MaxTargetWait's 20s", d)
				}
			}},

		// The long way.
		{name: "a target not allowed", b: helloBytes(&message{target: "127.0.0.1:2000"}, nil)},
		{name: "no target", b: helloBytes(&message{}, nil)},
		{name: "a layer to mirror", b: helloBytes(&message{stack: "zstd", target: "127.0.0.1:80"}, nil)},
		{name: "a layer not known", b: helloBytes(&message{stack: "nosuchlayer", target: "127.0.0.1:80"}, nil)},
		{name: "a lookup", b: helloBytes(&message{target: "127.0.0.1:80", lookup: true}, nil)},
		{name: "datagrams", lc: ListenConfig{Policy: Policy{Datagrams: []selector.Rule{{Action: selector.Direct}}}},
			b: helloBytes(&message{target: "127.0.0.1:80", dgram: true}, nil)},
		{name: "a key proven", b: helloBytes(&message{target: "127.0.0.1:80"}, key)},
		{name: "a node named", b: helloBytes(&message{target: "127.0.0.1:80", node: "alice"}, nil)},
		{name: "a route", lc: ListenConfig{Policy: Policy{Hops: []selector.Rule{{Action: selector.Direct}}}},
			b: helloBytes(&message{target: "127.0.0.1:80", hops: []string{"127.0.0.1:7001"}}, nil)},
		{name: "a keyed listener", lc: ListenConfig{Policy: Policy{Key: key}}, b: helloBytes(&message{target: "127.0.0.1:80"}, nil)},
		{name: "a bad congestion control", b: helloBytes(&message{target: "127.0.0.1:80", cc: "no such cc"}, nil)},
		{name: "cut short", b: helloBytes(&message{target: "127.0.0.1:80"}, nil)[:len(magic)+headerSize+3]},
		{name: "the magic alone", b: []byte(magic)},
		{name: "a plain client", b: []byte("GET / HTTP/1.1\r\n\r\n")},
		{name: "another version", b: append([]byte(magic), 2, byte(msgHello), 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := quickListener(t, tc.lc)
			b := append(bytes.Clone(tc.b), "the dialer's first bytes"...)
			q, ok := l.QuickHello(b, remote, time.Now())
			if ok != (tc.check != nil) {
				t.Fatalf("QuickHello: %v", ok)
			}
			if !ok {
				return
			}
			if q.Len != len(tc.b) || !bytes.Equal(q.Accept, plainAccept) {
				t.Errorf("Len %d, Accept %x; want %d (the dialer's bytes left), %x", q.Len, q.Accept, len(tc.b), plainAccept)
			}
			if tc.check != nil {
				tc.check(t, q)
			}
		})
	}
}

// TestQuickRefusal: a dial's failure becomes the refusal the long way
// sends, which the dialer reads as that error.
func TestQuickRefusal(t *testing.T) {
	q := &QuickHello{}
	for _, err := range []error{
		&RefusedError{Code: CodeTargetRefused, Reason: "target refused the connection"},
		net.UnknownNetworkError("an error of any other kind"),
	} {
		m, _, rerr := readFrame(bytes.NewReader(q.Refusal(err)), msgRefuse)
		if rerr != nil {
			t.Fatalf("%v: %v", err, rerr)
		}
		want := CodeRejected
		if re, ok := err.(*RefusedError); ok {
			want = re.Code
		}
		if m.code != want || m.reason == "" {
			t.Errorf("%v: refused with %v %q, want code %v", err, m.code, m.reason, want)
		}
	}
}

// FuzzQuickHello: whatever a socket holds first, QuickHello never
// panics, and takes only a whole hello to a target the policy allows.
func FuzzQuickHello(f *testing.F) {
	f.Add(helloBytes(&message{target: "127.0.0.1:80"}, nil))
	f.Add(helloBytes(&message{target: "127.0.0.1:80", cc: "reno", wait: 1 << 31}, nil))
	f.Add(helloBytes(&message{stack: "zstd", target: "127.0.0.1:80"}, nil))
	f.Add([]byte("SSH-2.0-"))
	l := quickListener(f, ListenConfig{MaxTargetWait: time.Hour})
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, ok := l.QuickHello(b, remote, time.Now())
		if !ok {
			return
		}
		if q.Len > len(b) || string(b[:len(magic)]) != magic {
			t.Fatalf("took %d bytes of %d, %q", q.Len, len(b), b)
		}
		if r, err := l.targets.Match(q.Hello.Target); err != nil || r.Action == selector.Refuse {
			t.Fatalf("took a hello to %q, which the policy refuses", q.Hello.Target)
		}
	})
}

// A hello too short to be one is an error, not a panic, and nothing is
// read.
func TestReadPlainAnswerShortHello(t *testing.T) {
	accept := (&message{typ: msgAccept}).appendFrame(nil)
	for _, n := range []int{0, len(magic), len(magic) + headerSize - 1} {
		r := bytes.NewReader(accept)
		hello := PlainHello(context.Background(), "127.0.0.1:80", "")[:n]
		if err := ReadPlainAnswer(r, hello); !errors.Is(err, ErrBadHello) || r.Len() != len(accept) {
			t.Errorf("hello of %d bytes: %v, %d bytes read; want ErrBadHello and none", n, err, len(accept)-r.Len())
		}
	}
}

// FuzzReadPlainAnswer: whatever a gateway answers, ReadPlainAnswer never
// panics, reads no further than one frame, and takes only an accept.
func FuzzReadPlainAnswer(f *testing.F) {
	hello := PlainHello(context.Background(), "127.0.0.1:80", "")
	f.Add((&message{typ: msgAccept}).appendFrame(nil))
	f.Add((&message{typ: msgRefuse, code: CodeTargetRefused, reason: "no"}).appendFrame(nil))
	f.Add((&message{typ: msgChallenge, nonce: make([]byte, nonceSize)}).appendFrame(nil))
	f.Add((&message{typ: msgAccept, aeads: []byte{1}}).appendFrame(nil))
	f.Add([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		err := ReadPlainAnswer(r, hello)
		read := len(b) - r.Len()
		if read > headerSize+maxBody {
			t.Fatalf("read %d bytes, more than a frame", read)
		}
		if err == nil && (read < headerSize || msgType(b[1]) != msgAccept) {
			t.Fatalf("%q taken for an accept", b)
		}
	})
}

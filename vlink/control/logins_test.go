package control

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink"
)

// syncBuffer is a log destination for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFailedLogins: each way a connection can fail to log in is counted
// under its reason and logged with it; the node that logs in right is
// not counted.
func TestFailedLogins(t *testing.T) {
	var logs syncBuffer
	tr := startRelay(t, RelayConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, "")
	connect(t, tr.addr, "alice")
	dial := func(d *vlink.Dialer) {
		c, err := d.DialContext(ctxT(t), "tcp", tr.addr)
		if err == nil {
			c.Write((&frame{op: opAdvertise}).append(nil))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			io.Copy(io.Discard, c)
			c.Close()
		}
	}
	for _, tc := range []struct {
		name, reason, log string
		try               func()
	}{
		{"another node's key", LoginAuthFailed, `code="authentication failed"`, func() {
			dial(&vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Node: "mallory", Key: vlink.NodeKey(networkKey, "alice")})
		}},
		{"another network's key", LoginAuthFailed, `code="authentication failed"`, func() {
			dial(&vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Node: "mallory", Key: vlink.NodeKey([]byte("another network's key"), "mallory")})
		}},
		{"no key", LoginAuthRequired, `code="authentication required"`, func() {
			dial(&vlink.Dialer{Stack: vlink.MustParse("identity")})
		}},
		{"the network key, no node name", LoginAuthRequired, `proved no node name`, func() {
			dial(&vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Key: networkKey})
		}},
		{"not encrypted", LoginPlaintext, `reason=not_encrypted`, func() {
			dial(&vlink.Dialer{Stack: vlink.MustParse("identity"), Node: "bob", Key: vlink.NodeKey(networkKey, "bob"), InsecurePlaintext: true})
		}},
		{"a scanner", LoginPlaintext, `plain connection refused`, func() {
			c, err := net.Dial("tcp", tr.addr)
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
			io.Copy(io.Discard, c)
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tr.Stats().FailedLogins
			tc.try()
			deadline := time.Now().Add(10 * time.Second)
			for tr.Stats().FailedLogins[tc.reason] == before[tc.reason] && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			after := tr.Stats().FailedLogins
			for _, r := range loginReasons {
				want := before[r]
				if r == tc.reason {
					want++
				}
				if after[r] != want {
					t.Errorf("failed logins %q: %d, want %d", r, after[r], want)
				}
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Errorf("the relay's log has no %q:\n%s", tc.log, logs.String())
			}
		})
	}
	if n := tr.Stats().Nodes; n != 1 {
		t.Errorf("%d nodes registered, want alice alone", n)
	}
}

// TestRefusalLogLimit: at most refusalLogBurst lines pass per
// refusalLogEvery; the next line to pass says how many were left out.
func TestRefusalLogLimit(t *testing.T) {
	var l logins
	start := time.Unix(1000, 0)
	passed := 0
	for i := range 3 * refusalLogBurst {
		if n, ok := l.allow(start.Add(time.Duration(i) * time.Millisecond)); ok {
			passed++
			if n != 0 {
				t.Errorf("line %d reports %d left out, want 0 within the first window", i, n)
			}
		}
	}
	if passed != refusalLogBurst {
		t.Errorf("%d lines passed in one window, want %d", passed, refusalLogBurst)
	}
	if n, ok := l.allow(start.Add(refusalLogEvery)); !ok || n != 2*refusalLogBurst {
		t.Errorf("the next window's first line: passed %v, left out %d; want true, %d", ok, n, 2*refusalLogBurst)
	}
}

package metrics

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// TestMetricsLabelsBounded: past their bounds, stacks and forwards
// count as other; a value seen before keeps its label; a relay's
// labels are its forward's, its stack's and its transport's.
func TestMetricsLabelsBounded(t *testing.T) {
	m := newMetrics()
	for i := range maxStackLabels + 5 {
		m.RelayStarted(Labels{Forward: "f", Stack: fmt.Sprintf("s%d", i), Transport: TransportTCP})
	}
	m.RelayStarted(Labels{Forward: "f", Stack: "s0", Transport: TransportTCP})
	if got := testutil.ToFloat64(m.open.WithLabelValues("f", "other", "tcp")); got != 5 {
		t.Errorf("stacks past the first %d: %v connections labelled other, want 5", maxStackLabels, got)
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("f", "s0", "tcp")); got != 2 {
		t.Errorf("a stack seen before keeps its label: %v connections labelled s0, want 2", got)
	}
	for i := range maxForwardLabels + 3 {
		m.RelayStarted(Labels{Forward: fmt.Sprintf("127.0.0.1:%d", 7000+i), Stack: "s0", Transport: TransportShm})
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("other", "s0", "shm")); got != 4 {
		t.Errorf("forwards past the first %d (one given already): %v connections labelled other, want 4", maxForwardLabels, got)
	}
	m.Dialed(Labels{Forward: "f", Stack: "s0", Transport: TransportTCP}, 0, errors.New("refused"))
	if got := testutil.ToFloat64(m.conns.WithLabelValues("f", "s0", "none", outcomeUnreachable)); got != 1 {
		t.Errorf("a failed dial: %v counted with transport none, want 1", got)
	}
}

func TestStackLabel(t *testing.T) {
	for _, tc := range []struct{ stack, want string }{
		{"zstd:level=3+tcp", "zstd"},
		{"zstd", "zstd"},
		{"noise+mux+quic", "noise+mux"},
		{"lz4+shm", "lz4"},
		{"tcp", "plain"},
		{"tcp:nodelay=false", "plain"},
		{"zstd+fwd:via=127.0.0.1:7000+tcp", "zstd"},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			if got := StackLabel(vlink.MustParse(tc.stack)); got != tc.want {
				t.Errorf("StackLabel(%s) = %q, want %q", tc.stack, got, tc.want)
			}
		})
	}
}

// addrConn is a connection whose local address is on network.
type addrConn struct {
	net.Conn
	network string
}

func (c addrConn) LocalAddr() net.Addr { return addr(c.network) }

type addr string

func (a addr) Network() string { return string(a) }
func (a addr) String() string  { return "x" }

// TestHelloStackLabel: a listener spells a stream of a multi-link
// session's stack as its dialer does, the session's layers included.
func TestHelloStackLabel(t *testing.T) {
	// A hello's stacks hold the mirrored layers only, no factory.
	layers := func(names ...string) vlink.Stack {
		var s vlink.Stack
		for _, n := range names {
			s.Layers = append(s.Layers, vlink.Layer{Name: n})
		}
		return s
	}
	for _, tc := range []struct {
		stack, session []string
		want           string
	}{
		{[]string{"zstd"}, nil, "zstd"},
		{[]string{"zstd"}, []string{"mux"}, "zstd+mux"},
		{nil, []string{"parallel"}, "parallel"},
		{[]string{"lz4"}, []string{"mux", "noise"}, "lz4+mux+noise"},
	} {
		h := &vlink.Hello{Stack: layers(tc.stack...), Session: layers(tc.session...)}
		if got := HelloStackLabel(h); got != tc.want {
			t.Errorf("HelloStackLabel(stack %s, session %s) = %q, want %q", tc.stack, tc.session, got, tc.want)
		}
	}
}

func TestTransport(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tc, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	for _, tc := range []struct {
		name string
		c    net.Conn
		want string
	}{
		{"a TCP connection", tc, TransportTCP},
		{"a UDP socket", uc, TransportUDP},
		{"a stream over UDP", addrConn{network: "udp"}, TransportQUIC},
		{"shared memory", addrConn{network: "shm"}, TransportShm},
		{"a node", addrConn{network: "vlink"}, TransportNode},
		{"a unix socket", addrConn{network: "unix"}, TransportUnix},
		{"anything else", addrConn{network: "pipe"}, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Transport(tc.c); got != tc.want {
				t.Errorf("Transport = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHandshakeStackLabel: a failed handshake is labelled with the stack
// its hello claimed, under a bound of its own, so that hellos nobody
// proved cannot take the labels of the stacks that run; a claim of a
// stack that runs keeps its name.
func TestHandshakeStackLabel(t *testing.T) {
	m := newMetrics()
	refused := &vlink.RefusedError{Code: vlink.CodeAuthFailed}
	claim := func(stack string) {
		m.Handshook(nil, time.Millisecond, &vlink.HandshakeError{Stack: stack, Err: refused})
	}
	// A flood of claims, each a stack of its own.
	for i := range 3 * maxClaimedLabels {
		claim(strings.Repeat("zstd+", i) + "lz4")
	}
	for _, tc := range []struct {
		stack string
		want  uint64
	}{
		{"lz4", 1},
		{strings.Repeat("zstd+", maxClaimedLabels-1) + "lz4", 1},
		{strings.Repeat("zstd+", maxClaimedLabels) + "lz4", 0},
		{"other", 2 * maxClaimedLabels},
	} {
		if got := handshakes(t, m, "authentication_failed", tc.stack); got != tc.want {
			t.Errorf("claims labelled %q: %d, want %d", tc.stack, got, tc.want)
		}
	}
	// Past the claims' bound, the claim of a stack that ran keeps its name.
	m.Handshook(nil, time.Millisecond, &vlink.HandshakeError{Stack: "zstd:level=3+tcp", Err: refused})
	if got := handshakes(t, m, "authentication_failed", "zstd"); got != 0 {
		t.Fatalf("a claim of a stack that never ran, past the bound: %d labelled zstd, want 0", got)
	}
	m.HandshakeDone("zstd", time.Millisecond)
	m.Handshook(nil, time.Millisecond, &vlink.HandshakeError{Stack: "zstd:level=3+tcp", Err: refused})
	if got := handshakes(t, m, "authentication_failed", "zstd"); got != 1 {
		t.Errorf("a claim of a stack that ran: %d labelled zstd, want 1", got)
	}
	// The stacks that run still get labels of their own, all of them.
	for i := range maxStackLabels - 1 {
		m.RelayStarted(Labels{Forward: "f", Stack: fmt.Sprintf("s%d", i), Transport: TransportTCP})
	}
	if got := testutil.ToFloat64(m.open.WithLabelValues("f", "other", "tcp")); got != 0 {
		t.Errorf("after the claims, %v connections of the first %d stacks labelled other, want 0", got, maxStackLabels)
	}

	for _, tc := range []struct {
		name, outcome, stack string
		err                  error
	}{
		{"unparsable", "authentication_failed", stackInvalid, &vlink.HandshakeError{Stack: "no-such-layer", Err: refused}},
		{"plain", "plain_refused", "plain", vlink.ErrPlainRefused},
		{"no hello", "timeout", StackNone, os.ErrDeadlineExceeded},
		{"a multi-link member", "ok", stackMember, nil}, // Observe is told no connection
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMetrics()
			m.Handshook(nil, time.Millisecond, tc.err)
			if got := handshakes(t, m, tc.outcome, tc.stack); got != 1 {
				t.Errorf("%d handshakes labelled outcome=%q stack=%q, want 1", got, tc.outcome, tc.stack)
			}
		})
	}
}

// handshakes is how many handshakes m counted with outcome and stack.
func handshakes(t *testing.T, m *Metrics, outcome, stack string) uint64 {
	t.Helper()
	var d dto.Metric
	if err := m.handshake.WithLabelValues(outcome, stack).(prometheus.Histogram).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}

package parallelstreams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/vlink-dev/vlink/filters/mux"
	"github.com/vlink-dev/vlink/vlink"
)

// logCounter is a slog.Handler counting the records with each message.
type logCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func newLogCounter() *logCounter { return &logCounter{n: map[string]int{}} }

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }

func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *logCounter) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[msg]
}

// TestSessionSource: each parallel session reaches Admit and Accept with
// the address of its own dialer, not that of the listener's first
// parallel session.
func TestSessionSource(t *testing.T) {
	var mu sync.Mutex
	var admitted []string
	l := listen(t, vlink.ListenConfig{
		Policy: vlink.Policy{Targets: allowAll()},
		Admit: func(ctx context.Context, h *vlink.Hello) (any, error) {
			mu.Lock()
			admitted = append(admitted, h.RemoteAddr.(*net.TCPAddr).IP.String())
			mu.Unlock()
			return nil, nil
		},
	})
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		t.Run(src, func(t *testing.T) {
			accepted := make(chan *vlink.Conn, 1)
			go func() {
				if c, err := l.AcceptVLink(); err == nil {
					accepted <- c
				}
			}()
			d := &vlink.Dialer{Stack: vlink.MustParse("parallel:streams=2+tcp:local=" + src), Via: l.Addr().String(), Timeout: 10 * time.Second}
			defer d.Close()
			c, err := d.Dial("tcp", "192.0.2.7:5432")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s := <-accepted
			defer s.Close()
			if got := s.Hello().RemoteAddr.(*net.TCPAddr).IP.String(); got != src {
				t.Errorf("accepted session's Hello.RemoteAddr is from %s, want %s", got, src)
			}
			mu.Lock()
			defer mu.Unlock()
			if got := admitted[len(admitted)-1]; got != src {
				t.Errorf("Admit saw a hello from %s, want %s", got, src)
			}
		})
	}
}

// TestNestingBound: a stack alternating mux and parallel far deeper than
// the listener allows is refused with a reason, after the listener has
// taken at most maxNesting multi-link layers for it (a parallel session
// used to start counting again from its table's first session).
func TestNestingBound(t *testing.T) {
	const maxNesting = 4 // vlink's bound on multi-link layers in one connection
	logs := newLogCounter()
	l := listen(t, vlink.ListenConfig{Logger: slog.New(logs)})
	// A first session, so the parallel table exists before the deep dial.
	dialPair(t, l, "parallel:streams=1")
	before := logs.count("vlink: multi-link member")

	layers := make([]string, 60)
	for i := range layers {
		layers[i] = "mux"
		if i%2 == 1 {
			layers[i] = "parallel:streams=1"
		}
	}
	d := &vlink.Dialer{Stack: vlink.MustParse(strings.Join(layers, "+")), Timeout: 10 * time.Second}
	defer d.Close()
	c, err := d.Dial("tcp", l.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("a stack of 30 nested multi-link layers was accepted")
	}
	if !errors.Is(err, vlink.ErrNotAllowed) || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("dial: %v, want a refusal for nesting (ErrNotAllowed)", err)
	}
	if n := logs.count("vlink: multi-link member") - before; n > maxNesting {
		t.Errorf("the listener took %d multi-link layers for one connection, want at most %d", n, maxNesting)
	}
}

// halfOpen opens n parallel sessions to l from the address src, each
// announcing streams substreams and sending one, as a hostile dialer
// would, and returns once the listener has answered each first hello.
// The sessions are abandoned at cleanup.
func halfOpen(t *testing.T, l *vlink.Listener, logs *logCounter, src string, streams, n int) {
	t.Helper()
	// In batches: more handshakes at once than the listener has slots
	// for would shed some of them, and the listener would hold fewer.
	const batch = 50
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	answered := func() int { return logs.count("vlink: multi-link member") + logs.count("vlink: refused") }
	for opened := 0; opened < n; {
		k := min(batch, n-opened)
		want := answered() + k
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := &vlink.Dialer{Stack: vlink.MustParse(fmt.Sprintf("parallel:streams=%d+rec:hang-after=1,local=%s,id=%s", streams, src, uniqueID()))}
				d.DialContext(ctx, "tcp", l.Addr().String())
			}()
		}
		opened += k
		for deadline := time.Now().Add(10 * time.Second); answered() < want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the listener answered %d of %d half-open sessions", answered()-want+opened, n)
			}
		}
	}
}

// TestBusy: sessions a dialer never completes fill at most its source
// address's share of the listener's table (SourceShare), so dialers from
// elsewhere still get in at once; when the whole table is full, a dialer
// is refused as busy, not left to time out.
func TestBusy(t *testing.T) {
	tests := []struct {
		name          string
		maxHandshakes int // the listener's, which bounds its table
		announced     int // substreams each hostile session announces
		hostile       int // half-open sessions from another address first
		want          error
	}{
		// Beyond the hostile source's share (64 of 256 by default).
		{"hostile source holds its share only", 0, 2, 300, nil},
		{"small table, a quarter for each source", 16, 2, 16, nil},
		// A source may hold one session of the size it asks for.
		{"table full", 4, 4, 4, vlink.ErrBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := newLogCounter()
			l := listen(t, vlink.ListenConfig{MaxHandshakes: tt.maxHandshakes, HandshakeTimeout: 30 * time.Second, Logger: slog.New(logs)})
			halfOpen(t, l, logs, "127.0.0.2", tt.announced, tt.hostile)

			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := l.Accept(); err == nil {
					accepted <- c
				}
			}()
			d := &vlink.Dialer{Stack: vlink.MustParse("parallel:streams=4+tcp:local=127.0.0.3"), Timeout: 10 * time.Second}
			defer d.Close()
			start := time.Now()
			c, err := d.Dial("tcp", l.Addr().String())
			took := time.Since(start)
			if tt.want != nil {
				if err == nil {
					c.Close()
					t.Fatal("dial succeeded")
				}
				if !errors.Is(err, tt.want) || errors.Is(err, vlink.ErrNotVLink) {
					t.Errorf("dial: %v, want %v (not %v)", err, tt.want, vlink.ErrNotVLink)
				}
			} else {
				if err != nil {
					t.Fatalf("dial from another address: %v", err)
				}
				c.Close()
				(<-accepted).Close()
				// The hostile source was refused beyond its share.
				if n := logs.count("vlink: refused"); n == 0 {
					t.Errorf("%d half-open sessions from one address, none refused", tt.hostile)
				}
			}
			if took > 2*time.Second {
				t.Errorf("the dial took %v", took)
			}
		})
	}
}

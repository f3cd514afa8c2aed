package vlink_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name: "test-at", Kind: layer.KindFactory, Terminal: true, Summary: "dial addr instead of the destination",
		Params: []layer.Param{{Name: "addr", Type: layer.TypeString}},
		New:    func(a layer.Args) (any, error) { return atFactory{a.String("addr")}, nil },
	})
}

// atFactory connects to its own address whatever the destination: a way
// that goes somewhere else (a silent host, a closed port).
type atFactory struct{ addr string }

func (f atFactory) DialContext(ctx context.Context, network, _ string, _ layer.ContextDialer) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, f.addr)
}

// silent is a listener that accepts and never answers: a way through it
// hangs in its handshake, as one through a black hole hangs in its SYN.
func silent(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return ln.Addr().String()
}

func bestEffort(t *testing.T, try ...string) *vlink.Dialer {
	t.Helper()
	cfg, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.1", Try: try}}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &vlink.Dialer{Config: cfg}
}

// TestBestEffort: a best-effort route races its ways Happy-Eyeballs
// style, takes the first that connects, and remembers what won and what
// failed.
func TestBestEffort(t *testing.T) {
	l := listen(t, vlink.ListenConfig{}) // takes plain TCP and VLink hellos
	hang := "test-xor+test-at:addr=" + silent(t)
	refused := "test-at:addr=" + testnet.RefusedAddr(t)
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	type want struct {
		way     string
		stopped []string // ways stopped because another won
		failed  []string // ways that failed
		within  time.Duration
		atLeast time.Duration
	}
	check := func(t *testing.T, d *vlink.Dialer, w want) *vlink.RouteReport {
		t.Helper()
		start := time.Now()
		c, rep, err := d.DialReport(ctx(), "tcp", l.Addr().String())
		took := time.Since(start)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.Close()
		testnet.RoundTrip(t, c, 64<<10)
		if got := vlink.PathOf(c); got != w.way || rep.Way != w.way {
			t.Fatalf("took %q (report: %q), want %q; report %+v", got, rep.Way, w.way, rep.Attempts)
		}
		for _, a := range rep.Attempts {
			switch {
			case a.Won != (a.Way == w.way):
				t.Errorf("%s: won %v", a.Way, a.Won)
			case a.Stopped != contains(w.stopped, a.Way):
				t.Errorf("%s: stopped %v, want %v (%+v)", a.Way, a.Stopped, !a.Stopped, a)
			case (a.Err != nil) != contains(w.failed, a.Way):
				t.Errorf("%s: error %v", a.Way, a.Err)
			}
		}
		if took > w.within || took < w.atLeast {
			t.Errorf("the dial took %v, want %v..%v", took, w.atLeast, w.within)
		}
		return rep
	}

	t.Run("the first way works", func(t *testing.T) {
		check(t, bestEffort(t, "direct", hang), want{way: "direct", within: vlink.RaceStagger})
	})
	t.Run("a hanging way costs the stagger, no more", func(t *testing.T) {
		d := bestEffort(t, hang, "test-xor", "direct")
		rep := check(t, d, want{way: "test-xor", stopped: []string{hang}, atLeast: vlink.RaceStagger, within: vlink.RaceStagger + time.Second})
		if len(rep.Attempts) != 3 || rep.Attempts[2].Started {
			t.Fatalf("direct was started, or is missing: %+v", rep.Attempts)
		}
		// Remembered: the winner goes first now, and wins at once.
		rep = check(t, d, want{way: "test-xor", within: vlink.RaceStagger})
		if rep.Attempts[0].Way != "test-xor" || rep.Attempts[0].Note != "won last time" {
			t.Fatalf("second dial's first attempt: %+v", rep.Attempts[0])
		}
	})
	t.Run("overlapping races keep their own stagger", func(t *testing.T) {
		// One clock serves every race: each must still start its next
		// way RaceStagger after its own start, not after another's.
		const n, apart = 3, 150 * time.Millisecond
		reps := make(chan *vlink.RouteReport, n)
		for i := range n {
			d := bestEffort(t, hang, "test-xor") // its own memory
			go func() {
				time.Sleep(time.Duration(i) * apart)
				c, rep, err := d.DialReport(ctx(), "tcp", l.Addr().String())
				if err == nil {
					c.Close()
				}
				reps <- rep
			}()
		}
		for range n {
			rep := <-reps
			if rep.Way != "test-xor" || len(rep.Attempts) != 2 {
				t.Fatalf("took %q, attempts %+v", rep.Way, rep.Attempts)
			}
			if s := rep.Attempts[1].Start; s < vlink.RaceStagger || s > vlink.RaceStagger+apart {
				t.Errorf("the second way started %v into its dial, want the stagger, %v", s, vlink.RaceStagger)
			}
		}
	})
	t.Run("a refused way does not wait for the stagger", func(t *testing.T) {
		d := bestEffort(t, refused, "direct")
		check(t, d, want{way: "direct", failed: []string{refused}, within: vlink.RaceStagger})
		// Remembered: the failed way goes last, and is not started.
		rep := check(t, d, want{way: "direct", within: vlink.RaceStagger})
		if last := rep.Attempts[1]; last.Way != refused || last.Started || last.Note != "failed just now" {
			t.Fatalf("second dial's last attempt: %+v", last)
		}
	})
	t.Run("no way works", func(t *testing.T) {
		_, err := bestEffort(t, refused, "test-xor+"+refused).Dial("tcp", l.Addr().String())
		var re *vlink.RaceError
		if !errors.As(err, &re) || !errors.Is(err, syscall.ECONNREFUSED) || len(re.Attempts) != 2 {
			t.Fatalf("dial = %v; want a RaceError of two refusals", err)
		}
		if !strings.Contains(err.Error(), refused+":") || !strings.Contains(err.Error(), "test-xor+"+refused+":") {
			t.Fatalf("the error does not name each way: %v", err)
		}
	})
	t.Run("the caller gives up", func(t *testing.T) {
		d := bestEffort(t, hang)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := d.DialContext(ctx, "tcp", l.Addr().String()); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("dial = %v, want the context's deadline", err)
		}
		// Not held against the way: it is still first.
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer ccancel()
		_, rep, _ := d.DialReport(cctx, "tcp", l.Addr().String())
		if rep.Attempts[0].Note != "" {
			t.Fatalf("a way the caller gave up on was remembered: %+v", rep.Attempts[0])
		}
	})
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestBestEffortConfig: try in a config file, narrowed by the
// environment (VLINK_PATHS_ONLY, VLINK_PATHS_EXCLUDE).
func TestBestEffortConfig(t *testing.T) {
	l := listen(t, vlink.ListenConfig{})
	dir := t.TempDir()
	path := writeFile(t, dir, "config.toml", `
[[route]]
host = "127.0.0.1"
try = ["direct", "test-xor"]
`, 0o600)
	t.Setenv(vlink.EnvConfig, path)
	for _, tt := range []struct {
		only, exclude string
		way           string
		err           error
	}{
		{"", "", "direct", nil},
		{"", "direct", "test-xor", nil},
		{"test-xor", "", "test-xor", nil},
		{"direct,test-xor", "", "direct", nil},
		{"", "test-xor, direct", "", vlink.ErrNoWay},
		{"ssh", "", "", vlink.ErrNoWay},
	} {
		t.Run("only="+tt.only+" exclude="+tt.exclude, func(t *testing.T) {
			t.Setenv(vlink.EnvPathsOnly, tt.only)
			t.Setenv(vlink.EnvPathsExclude, tt.exclude)
			cfg, err := vlink.ConfigFromEnv()
			if err != nil {
				t.Fatal(err)
			}
			d := &vlink.Dialer{Config: cfg}
			c, err := d.Dial("tcp", l.Addr().String())
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("dial = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := vlink.PathOf(c); got != tt.way {
				t.Fatalf("took %q, want %q", got, tt.way)
			}
			testnet.RoundTrip(t, c, 1<<10)
		})
	}
	if _, err := vlink.LoadConfig(writeFile(t, dir, "bad.toml", `
[[route]]
try = ["direct", "nosuchlayer"]
`, 0o600)); !errors.Is(err, vlink.ErrUnknownLayer) {
		t.Fatalf("a try list naming an unknown layer: %v", err)
	}
}

package control

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// only allows the named paths, as VLINK_PATHS_ONLY does.
func only(paths ...string) func(string) bool {
	return func(p string) bool { return slices.Contains(paths, p) }
}

// A dial remembers the path that won: where the node cannot connect
// back, the next dials go straight to the relay, without a connection
// back that cannot work and without waiting out the relay's stagger;
// and where that path fails, the whole ladder is climbed again.
func TestDialLearns(t *testing.T) {
	r := startRelay(t, RelayConfig{}, "")
	a, b := connect(t, r.addr, "alice"), connect(t, r.addr, "bob")
	paths := echoListener(t, b, 7)
	back := silentReverse(t, a)

	dial := func(want string) time.Duration {
		t.Helper()
		start := time.Now()
		nc, err := a.DialNodeWays(ctxT(t), "bob", 7, only("reverse", "relay"))
		if err != nil {
			t.Fatal(err)
		}
		c := nc.(*Conn)
		took := time.Since(start)
		if p := c.Path(); p != want || <-paths != want {
			t.Fatalf("came by %q, want %s", p, want)
		}
		echoThrough(t, c)
		c.Close()
		return took
	}
	first := dial("relay")
	waitUntil(t, "bob's connection back", func() bool { return back.Load() == 1 })
	second := dial("relay")
	t.Logf("first dial %v, second %v", first.Round(time.Millisecond), second.Round(time.Millisecond))
	if second >= relayStagger {
		t.Errorf("the second dial took %v: it waited out the relay's stagger again", second)
	}
	time.Sleep(100 * time.Millisecond)
	if n := back.Load(); n != 1 {
		t.Fatalf("bob connected back %d times, want once: the second dial offered the path that lost", n)
	}
	// A stack that names its paths takes them all, whatever was learned.
	c, err := a.DialPaths(ctxT(t), "bob", 7, PathReverse|PathRelay)
	if err != nil {
		t.Fatal(err)
	}
	<-paths
	c.Close()
	waitUntil(t, "bob's connection back for the dial by named paths", func() bool { return back.Load() == 2 })

	// A splice that won before cannot work now (alice seems behind a NAT
	// that changes ports): the dial climbs the ladder again, here back
	// to the connection back, in vain.
	a.mu.Lock()
	a.learned["bob"] = learnedPath{won: PathSplice, at: time.Now()}
	a.observed = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), a.local.Port()+1)
	a.mu.Unlock()
	if _, err := a.DialNodeWays(ctxT(t), "bob", 7, only("reverse", "splice")); err == nil {
		t.Fatal("a dial by paths that cannot work succeeded")
	}
	if n := back.Load(); n != 3 {
		t.Fatalf("bob connected back %d times, want 3: a failed narrowed dial did not fall back on the whole ladder", n)
	}
	a.mu.Lock()
	_, kept := a.learned["bob"]
	a.mu.Unlock()
	if kept {
		t.Fatal("a path that failed is still remembered")
	}
}

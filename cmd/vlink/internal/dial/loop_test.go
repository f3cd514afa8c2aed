package dial

import (
	"net/netip"
	"testing"
	"time"
)

// TestLoopFactory: which tunnels the event loop carries, and with the
// tcp layer's parameters applied.
func TestLoopFactory(t *testing.T) {
	v4, v6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	for _, tc := range []struct {
		stack  string
		target netip.Addr
		want   bool
	}{
		{"tcp", v4, true},
		{"tcp", v6, true},
		{"tcp:nodelay=false", v4, true},
		{"tcp:keepalive=1m", v4, true},
		{"tcp:cc=reno", v4, true},
		{"tcp:family=4", v4, true},
		{"tcp:family=6", v4, false}, // the goroutines' dial says why
		{"tcp:family=6", v6, true},
		{"tcp:ports=40000-40010", v4, false},
		{"tcp:local=127.0.0.1", v4, false},
		{"zstd", v4, false},
		{"zstd+tcp", v4, false},
		{"identity+tcp", v4, false},
	} {
		f := loopFactory(tc.stack, tc.target)
		if (f != nil) != tc.want {
			t.Errorf("%s to %s: event loop %v, want %v", tc.stack, tc.target, f != nil, tc.want)
		}
	}
	f := loopFactory("tcp:nodelay=false+tcp", v4)
	if f != nil {
		t.Errorf("a stack of two factories went to the loop")
	}
	f = loopFactory("tcp:nodelay=false,keepalive=1m,cc=reno", v4)
	if f == nil {
		t.Fatal("no factory")
	}
	if o := f.Options(); !o.NoNagle || o.KeepAlive != time.Minute || o.CongestionControl != "reno" {
		t.Errorf("the loop's factory has %+v, want the stack's parameters", o)
	}
}

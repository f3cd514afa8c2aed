package tcp

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeArgs reads parameters the way layer.Args does: given values, else the
// registered schema's defaults.
type fakeArgs map[string]string

func (a fakeArgs) raw(name string) string {
	if v, ok := a[name]; ok {
		return v
	}
	spec, _ := layer.Lookup("tcp")
	for _, p := range spec.Params {
		if p.Name == name {
			return p.Default
		}
	}
	panic("no parameter " + name)
}

func (a fakeArgs) Bool(name string) bool {
	b, err := strconv.ParseBool(a.raw(name))
	if err != nil {
		panic(err)
	}
	return b
}

func (a fakeArgs) Duration(name string) time.Duration {
	d, err := time.ParseDuration(a.raw(name))
	if err != nil {
		panic(err)
	}
	return d
}

func (a fakeArgs) String(name string) string { return a.raw(name) }

func mustFactory(t testing.TB, a fakeArgs) *Factory {
	t.Helper()
	f, err := newFromArgs(a)
	if err != nil {
		t.Fatalf("newFromArgs(%v): %v", a, err)
	}
	return f
}

// roundTrip sends n random bytes each way between c1 and c2 at once and
// checks their SHA-256 on arrival.
func roundTrip(t *testing.T, c1, c2 net.Conn, n int) {
	t.Helper()
	var wg sync.WaitGroup
	check := func(dst, src net.Conn) {
		defer wg.Done()
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rand.Uint32())
		}
		want := sha256.Sum256(data)
		go func() { src.Write(data) }()
		got := make([]byte, n)
		if _, err := io.ReadFull(dst, got); err != nil {
			t.Errorf("read: %v", err)
			return
		}
		if sha256.Sum256(got) != want {
			t.Errorf("SHA-256 mismatch over %d bytes", n)
		}
	}
	wg.Add(2)
	go check(c1, c2)
	go check(c2, c1)
	wg.Wait()
}

func dialAccept(t *testing.T, f *Factory, network string, ln net.Listener) (c, s net.Conn) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	c, err := f.DialContext(context.Background(), network, ln.Addr().String(), nil)
	if err != nil {
		ln.Close()
		<-ch
		t.Fatalf("dial %s: %v", ln.Addr(), err)
	}
	r := <-ch
	if r.err != nil {
		c.Close()
		t.Fatalf("accept: %v", r.err)
	}
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c, r.c
}

func TestDialListen(t *testing.T) {
	tests := []struct {
		name, network, addr string
		args                fakeArgs
		v6                  bool
	}{
		{"ipv4", "tcp", "127.0.0.1:0", fakeArgs{}, false},
		{"ipv6", "tcp", "[::1]:0", fakeArgs{}, true},
		{"ipv4-only", "tcp", "127.0.0.1:0", fakeArgs{"family": "4"}, false},
		{"ipv6-only", "tcp", "[::1]:0", fakeArgs{"family": "6"}, true},
		{"tcp4", "tcp4", "127.0.0.1:0", fakeArgs{}, false},
		{"tcp6", "tcp6", "[::1]:0", fakeArgs{}, true},
		{"options-off", "tcp", "127.0.0.1:0", fakeArgs{"nodelay": "false", "keepalive": "0s"}, false},
		{"local-ipv4", "tcp", "127.0.0.1:0", fakeArgs{"local": "127.0.0.1"}, false},
		{"local-ipv6", "tcp", "[::1]:0", fakeArgs{"local": "::1"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.v6 {
				testenv.IPv6Loopback(t)
			}
			f := mustFactory(t, tt.args)
			ln, err := f.Listen(context.Background(), tt.network, tt.addr, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c, s := dialAccept(t, f, tt.network, ln)
			for _, conn := range []net.Conn{c, s} {
				if _, ok := conn.(*net.TCPConn); !ok {
					t.Errorf("got %T, want *net.TCPConn so the zero-copy path stays available", conn)
				}
				la := conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr()
				if la.Unmap().Is6() != tt.v6 {
					t.Errorf("local address %v, want IPv6=%v", la, tt.v6)
				}
			}
			for _, n := range []int{0, 1, 1 << 20} {
				roundTrip(t, c, s, n)
			}
		})
	}
}

func TestFamilyConflicts(t *testing.T) {
	testenv.IPv6Loopback(t)
	ln6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln6.Close()
	tests := []struct {
		name    string
		args    fakeArgs
		network string
		addr    string
		family  bool // ErrFamily expected (else any *net.OpError)
	}{
		{"family4-tcp6", fakeArgs{"family": "4"}, "tcp6", ln6.Addr().String(), true},
		{"family6-tcp4", fakeArgs{"family": "6"}, "tcp4", "127.0.0.1:1", true},
		{"local4-tcp6", fakeArgs{"local": "127.0.0.1"}, "tcp6", ln6.Addr().String(), true},
		{"family4-v6-literal", fakeArgs{"family": "4"}, "tcp", ln6.Addr().String(), false},
		{"local4-v6-literal", fakeArgs{"local": "127.0.0.1"}, "tcp", ln6.Addr().String(), false},
		{"udp", fakeArgs{}, "udp", "127.0.0.1:1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustFactory(t, tt.args)
			c, err := f.DialContext(context.Background(), tt.network, tt.addr, nil)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" {
				t.Errorf("error %v (%T), want a dial *net.OpError", err, err)
			}
			if tt.family != errors.Is(err, ErrFamily) {
				t.Errorf("errors.Is(%v, ErrFamily) = %v, want %v", err, !tt.family, tt.family)
			}
		})
	}
	// The source address restricts dialing only: listening on IPv6 is
	// still allowed.
	f := mustFactory(t, fakeArgs{"local": "127.0.0.1"})
	ln, err := f.Listen(context.Background(), "tcp6", "[::1]:0", nil)
	if err != nil {
		t.Fatalf("listen tcp6 with local=127.0.0.1: %v", err)
	}
	ln.Close()
}

func TestLocalSource(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("skipping: only Linux routes all of 127/8 to loopback")
	}
	f := mustFactory(t, fakeArgs{"local": "127.0.0.2"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, s := dialAccept(t, f, "tcp", ln)
	want := netip.MustParseAddr("127.0.0.2")
	if got := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != want {
		t.Errorf("dialer's local address %v, want %v", got, want)
	}
	if got := s.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != want {
		t.Errorf("server sees %v, want %v", got, want)
	}
}

// freeRange returns a range of n ports below the kernel's ephemeral range,
// chosen at random so parallel runs rarely collide.
func freeRange(n int) PortRange {
	lo := 20000 + rand.IntN(10000)
	return PortRange{Lo: uint16(lo), Hi: uint16(lo + n - 1)}
}

func TestPortRange(t *testing.T) {
	if !canBindPorts {
		t.Skip("skipping: port ranges are not supported on " + runtime.GOOS)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	t.Run("dial", func(t *testing.T) {
		r := freeRange(16)
		f := mustFactory(t, fakeArgs{"ports": r.String()})
		seen := map[int]bool{}
		for range 8 {
			c, _ := dialAccept(t, f, "tcp", ln)
			port := c.LocalAddr().(*net.TCPAddr).Port
			if !r.Contains(port) {
				t.Errorf("local port %d outside %s", port, r)
			}
			if seen[port] {
				t.Errorf("port %d used twice", port)
			}
			seen[port] = true
		}
	})

	t.Run("listen", func(t *testing.T) {
		r := freeRange(4)
		f := mustFactory(t, fakeArgs{"ports": r.String()})
		for _, addr := range []string{"127.0.0.1:0", ":0"} {
			l, err := f.Listen(context.Background(), "tcp", addr, nil)
			if err != nil {
				t.Fatal(err)
			}
			if port := l.Addr().(*net.TCPAddr).Port; !r.Contains(port) {
				t.Errorf("listening on %d, outside %s", port, r)
			}
			l.Close()
		}
		// An explicit port is honoured as given.
		l, err := f.Listen(context.Background(), "tcp", ln.Addr().String(), nil)
		if err == nil {
			l.Close()
			t.Error("listen on a taken explicit port succeeded")
		}
	})

	t.Run("exhausted-by-listeners", func(t *testing.T) {
		// A range this test holds whole: one where another program
		// holds a port is no test of exhaustion, so another is drawn.
		var r PortRange
		var held []net.Listener
		defer func() {
			for _, l := range held {
				l.Close()
			}
		}()
		for try := 0; len(held) < 3; try++ {
			if try == 100 {
				t.Fatalf("no range of 3 free ports in 100 draws: %v", r)
			}
			for _, l := range held {
				l.Close()
			}
			held = held[:0]
			r = freeRange(3)
			for p := int(r.Lo); p <= int(r.Hi); p++ {
				l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
				if err != nil {
					break
				}
				held = append(held, l)
			}
		}
		f := mustFactory(t, fakeArgs{"ports": r.String()})
		c, err := f.DialContext(context.Background(), "tcp", ln.Addr().String(), nil)
		if err == nil {
			c.Close()
			t.Fatal("dial succeeded with every port of the range listening")
		}
		var oe *net.OpError
		if !errors.Is(err, ErrNoFreePort) || !errors.As(err, &oe) {
			t.Errorf("dial error %v, want a *net.OpError matching ErrNoFreePort", err)
		}
		l, err := f.Listen(context.Background(), "tcp", ":0", nil)
		if err == nil {
			l.Close()
			t.Fatal("listen succeeded with every port of the range taken")
		}
		if !errors.Is(err, ErrNoFreePort) || !errors.As(err, &oe) {
			t.Errorf("listen error %v, want a *net.OpError matching ErrNoFreePort", err)
		}
	})

	t.Run("exhausted-by-connections", func(t *testing.T) {
		// Two connections to the same peer use both ports; a third has
		// no 4-tuple left.
		r := freeRange(2)
		f := mustFactory(t, fakeArgs{"ports": r.String()})
		dialAccept(t, f, "tcp", ln)
		dialAccept(t, f, "tcp", ln)
		c, err := f.DialContext(context.Background(), "tcp", ln.Addr().String(), nil)
		if err == nil {
			c.Close()
			t.Fatal("third dial from a two-port range succeeded")
		}
		if !errors.Is(err, ErrNoFreePort) {
			t.Errorf("dial error %v, want ErrNoFreePort", err)
		}
	})

	t.Run("one-port-many-peers", func(t *testing.T) {
		// A single port serves consecutive connections, including
		// after the active close left it in TIME_WAIT.
		r := freeRange(1)
		f := mustFactory(t, fakeArgs{"ports": r.String()})
		for range 3 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			c, s := dialAccept(t, f, "tcp", l)
			if port := c.LocalAddr().(*net.TCPAddr).Port; port != int(r.Lo) {
				t.Errorf("local port %d, want %d", port, r.Lo)
			}
			c.Close() // we close first: TIME_WAIT on our side
			s.Close()
			l.Close()
		}
	})
}

func TestBadParams(t *testing.T) {
	tests := []struct {
		name string
		args fakeArgs
	}{
		{"family", fakeArgs{"family": "5"}},
		{"local-not-ip", fakeArgs{"local": "example.com"}},
		{"local-wrong-family", fakeArgs{"local": "::1", "family": "4"}},
		{"local-unspecified", fakeArgs{"local": "0.0.0.0"}},
		{"ports-zero", fakeArgs{"ports": "0-10"}},
		{"ports-reversed", fakeArgs{"ports": "40100-40000"}},
		{"ports-text", fakeArgs{"ports": "abc"}},
		{"ports-too-big", fakeArgs{"ports": "65000-70000"}},
		{"ports-open-ended", fakeArgs{"ports": "40000-"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := newFromArgs(tt.args)
			if !errors.Is(err, layer.ErrBadParam) {
				t.Errorf("newFromArgs(%v) = %v, %v; want an error matching layer.ErrBadParam", tt.args, f, err)
			}
		})
	}
	// Schema bounds are checked when the stack is parsed.
	for _, spec := range []string{"tcp:keepalive=3h", "tcp:keepalive=-1s", "tcp:nodelay=maybe", "tcp:bogus=1"} {
		t.Run(spec, func(t *testing.T) {
			if _, err := vlink.Parse(spec); !errors.Is(err, layer.ErrBadParam) {
				t.Errorf("Parse(%q) error %v, want layer.ErrBadParam", spec, err)
			}
		})
	}
	if _, err := New(Options{KeepAlive: 3 * time.Hour}); !errors.Is(err, layer.ErrBadParam) {
		t.Errorf("New with a 3h keep-alive: %v, want layer.ErrBadParam", err)
	}
	if _, err := New(Options{Network: "udp"}); !errors.Is(err, layer.ErrBadParam) {
		t.Errorf("New with network udp: %v, want layer.ErrBadParam", err)
	}
}

func TestRegistered(t *testing.T) {
	spec, ok := layer.Lookup("tcp")
	if !ok || spec.Kind != layer.KindFactory || !spec.Terminal {
		t.Fatalf("tcp registered as %+v, %v", spec, ok)
	}
	for _, p := range spec.Params {
		if p.Doc == "" || !p.Local {
			t.Errorf("parameter %s: Doc=%q Local=%v, want documented and local", p.Name, p.Doc, p.Local)
		}
	}
	s, err := vlink.Parse("tcp:family=6,local=::1,ports=40000-40100,nodelay=false,keepalive=30s")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); got != "tcp:family=6,keepalive=30s,local=::1,nodelay=false,ports=40000-40100" {
		t.Errorf("round trip: %s", got)
	}
	f := mustFactory(t, fakeArgs{"family": "6", "local": "::1", "ports": "40000-40100", "nodelay": "false", "keepalive": "30s"})
	want := Options{NoNagle: true, KeepAlive: 30 * time.Second, Network: "tcp6",
		Local: netip.MustParseAddr("::1"), Ports: PortRange{40000, 40100}}
	if got := f.Options(); got != want {
		t.Errorf("options %+v, want %+v", got, want)
	}
	if got := mustFactory(t, fakeArgs{"keepalive": "0s"}).Options().KeepAlive; got >= 0 {
		t.Errorf("keepalive=0 gives KeepAlive %v, want negative (off)", got)
	}
}

func TestNettest(t *testing.T) {
	f := mustFactory(t, fakeArgs{})
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		ch := make(chan net.Conn, 1)
		go func() { c, _ := ln.Accept(); ch <- c }()
		c1, err = f.DialContext(context.Background(), "tcp", ln.Addr().String(), nil)
		c2 = <-ch
		if err != nil || c2 == nil {
			if c1 != nil {
				c1.Close()
			}
			if c2 != nil {
				c2.Close()
			}
			return nil, nil, nil, errors.Join(err, errors.New("accept failed"))
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

func TestLocalAddrs(t *testing.T) {
	addrs, err := LocalAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) == 0 {
		t.Fatal("no local addresses, not even loopback")
	}
	routable := false
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
			t.Errorf("unusable address %v", a)
		}
		if a.IsGlobalUnicast() {
			routable = true
		}
	}
	for _, a := range addrs {
		if routable && (a.IsLinkLocalUnicast() || a.IsLoopback()) {
			t.Errorf("%v returned alongside routable addresses %v", a, addrs)
		}
	}
	t.Logf("local addresses: %v", addrs)
}

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in   string
		want PortRange
		ok   bool
	}{
		{"40000-40100", PortRange{40000, 40100}, true},
		{"443", PortRange{443, 443}, true},
		{"1-65535", PortRange{1, 65535}, true},
		{"0", PortRange{}, false},
		{"", PortRange{}, false},
		{"-", PortRange{}, false},
		{"5-4", PortRange{}, false},
		{"1-65536", PortRange{}, false},
		{" 1-2", PortRange{}, false},
		{"+1-2", PortRange{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePortRange(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("ParsePortRange(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
			}
			if err != nil && !errors.Is(err, layer.ErrBadParam) {
				t.Errorf("error %v does not match layer.ErrBadParam", err)
			}
		})
	}
}

func TestPickerVisitsEveryPortOnce(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 64, 1000} {
		r := PortRange{Lo: 1000, Hi: uint16(1000 + n - 1)}
		p := r.picker()
		seen := map[int]bool{}
		for {
			port, ok := p.next()
			if !ok {
				break
			}
			if !r.Contains(port) || seen[port] {
				t.Fatalf("n=%d: port %d outside range or repeated", n, port)
			}
			seen[port] = true
		}
		if len(seen) != n {
			t.Errorf("n=%d: visited %d ports", n, len(seen))
		}
	}
}

func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"40000-40100", "1", "65535", "0-1", "5-4", "a-b", "-", "1-2-3", "99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParsePortRange(s)
		if err != nil {
			if !errors.Is(err, layer.ErrBadParam) {
				t.Fatalf("error %v does not match layer.ErrBadParam", err)
			}
			return
		}
		if r.Lo == 0 || r.Lo > r.Hi {
			t.Fatalf("accepted invalid range %v from %q", r, s)
		}
		back, err := ParsePortRange(r.String())
		if err != nil || back != r {
			t.Fatalf("round trip of %v: %v, %v", r, back, err)
		}
	})
}

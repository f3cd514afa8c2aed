package vlink

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Test-only layers. "tcp" itself comes from factories/tcp, which the
// external tests of this package import.
func init() {
	layer.Register(layer.Spec{
		Name: "test-filter", Kind: layer.KindFilter, Summary: "parameters of every type",
		Params: []layer.Param{
			{Name: "level", Type: layer.TypeInt, Default: "3", Min: 1, Max: 9},
			{Name: "name", Type: layer.TypeString},
			{Name: "flag", Type: layer.TypeBool},
			{Name: "wait", Type: layer.TypeDuration, Default: "1s", Min: 0, Max: int64(1e12)},
			{Name: "window", Type: layer.TypeSize, Default: "64K", Min: 1 << 10, Max: 1 << 20},
		},
		New: func(a layer.Args) (any, error) { return xorFilter{key: byte(a.Int("level"))}, nil },
	})
	layer.Register(layer.Spec{
		Name: "test-xor", Kind: layer.KindFilter, Summary: "xor every byte with key, so a missing mirror garbles data",
		Params: []layer.Param{{Name: "key", Type: layer.TypeInt, Default: "90", Min: 1, Max: 255}},
		New:    func(a layer.Args) (any, error) { return xorFilter{key: byte(a.Int("key"))}, nil },
	})
	layer.Register(layer.Spec{
		Name: "test-proxy", Kind: layer.KindFactory, Summary: "a non-terminal factory that dials through forward",
		Params: []layer.Param{{Name: "addr", Type: layer.TypeString}},
		New:    func(a layer.Args) (any, error) { return proxyFactory{}, nil },
	})
}

type xorFilter struct{ key byte }

func (f xorFilter) Client(c net.Conn) (net.Conn, error) { return &xorConn{Conn: c, key: f.key}, nil }
func (f xorFilter) Server(c net.Conn) (net.Conn, error) { return &xorConn{Conn: c, key: f.key}, nil }

type xorConn struct {
	net.Conn
	key byte
}

func (c *xorConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	for i := range p[:n] {
		p[i] ^= c.key
	}
	return n, err
}

func (c *xorConn) Write(p []byte) (int, error) {
	q := make([]byte, len(p))
	for i := range p {
		q[i] = p[i] ^ c.key
	}
	return c.Conn.Write(q)
}

func (c *xorConn) CloseWrite() error { return c.Conn.(interface{ CloseWrite() error }).CloseWrite() }

type proxyFactory struct{}

func (proxyFactory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	return forward.DialContext(ctx, network, address)
}

func TestParseFormat(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"", "tcp"},
		{"tcp", "tcp"},
		{"test-xor", "test-xor+tcp"},
		{"test-xor:key=7+tcp", "test-xor:key=7+tcp"},
		{"test-filter:name=a,level=2,flag", "test-filter:flag=true,level=2,name=a+tcp"},
		{"test-filter:name=a%2Cb%2Bc%25d%20e", "test-filter:name=a%2Cb%2Bc%25d%20e+tcp"},
		{"test-filter:name=user@host:22/path=x", "test-filter:name=user@host:22/path=x+tcp"},
		{"test-filter:window=1M,wait=90s", "test-filter:wait=90s,window=1M+tcp"},
		{"test-xor+test-filter+test-proxy:addr=p:1080", "test-xor+test-filter+test-proxy:addr=p:1080+tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			s, err := Parse(tt.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			if got := s.String(); got != tt.want {
				t.Fatalf("Parse(%q).String() = %q, want %q", tt.in, got, tt.want)
			}
			again, err := Parse(s.String())
			if err != nil || again.String() != tt.want {
				t.Fatalf("round trip of %q: %v, %q", tt.want, err, again.String())
			}
			fromCfg, err := FromConfig(s.Config())
			if err != nil || fromCfg.String() != tt.want {
				t.Fatalf("structured round trip of %q: %v, %q", tt.want, err, fromCfg.String())
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in      string
		is      error
		index   int
		mention string
	}{
		{"nope", ErrUnknownLayer, 1, "known: "},
		{"test-xor+nope", ErrUnknownLayer, 2, "layer 2 (nope)"},
		{"test-xor:key=300", ErrBadParam, 1, "outside [1, 255]"},
		{"test-xor:key=x", ErrBadParam, 1, "not an integer"},
		{"test-xor:kee=1", ErrBadParam, 1, "known: key"},
		{"tcp:nodelay=1,nodelay=0", ErrSyntax, 1, "given twice"},
		{"test-xor++tcp", ErrSyntax, 2, "empty layer name"},
		{"test-xor:", ErrSyntax, 1, "no parameters"},
		{"Zstd", ErrSyntax, 1, "lower-case"},
		{"test-filter:name=%zz", ErrSyntax, 1, "bad escape"},
		{"test-filter:window=2G", ErrBadParam, 1, "outside"},
		{"test-filter:wait=soon", ErrBadParam, 1, "duration"},
		{"tcp+test-xor", ErrBadStack, 1, "must be the last layer"},
		{"test-proxy+test-xor", ErrBadStack, 2, "above every factory"},
		{" tcp", ErrSyntax, 0, "space"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := Parse(tt.in)
			if !errors.Is(err, tt.is) {
				t.Fatalf("Parse(%q) = %v, want %v", tt.in, err, tt.is)
			}
			var se *StackError
			if !errors.As(err, &se) || se.Index != tt.index {
				t.Fatalf("Parse(%q): error %#v, want a *StackError at layer %d", tt.in, err, tt.index)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("Parse(%q) = %q, want it to mention %q", tt.in, err, tt.mention)
			}
		})
	}
}

func TestMirroredSplit(t *testing.T) {
	s := MustParse("test-xor+test-filter+test-proxy:addr=p:1")
	if got := (Stack{Layers: s.mirrored()}).String(); got != "test-xor+test-filter" {
		t.Fatalf("mirrored = %q", got)
	}
	if len(s.factories()) != 2 || s.IsPlain() {
		t.Fatalf("factories = %v, plain = %v", s.factories(), s.IsPlain())
	}
	if !MustParse("test-proxy+tcp").IsPlain() {
		t.Fatal("a stack of factories is plain")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "tcp", "test-xor:key=7", "test-filter:name=a%2Cb,flag+test-proxy:addr=x:1+tcp", "a+:b", "x:y=%",
		"socks5h://a:b@h:1", "test-xor+http://u:p%2B@[::1]:3128/", "socks4://u:p@h", "SOCKS5://h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			var se *StackError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) error is not a *StackError: %v", in, err)
			}
			return
		}
		out := s.String()
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(%q) ok, but its String %q does not parse: %v", in, out, err)
		}
		if again.String() != out {
			t.Fatalf("not canonical: %q -> %q -> %q", in, out, again.String())
		}
	})
}

// TestStackErrorRedacts: a secret written in a stack by mistake is never
// echoed by the error that refuses it, well-formed stack or not.
func TestStackErrorRedacts(t *testing.T) {
	for _, text := range []string{
		"ssh:host=x,password=hunter2+zstd",
		"zstd+socks5:user=u,secret=hunter2",
		"http:token=hunter2,,=+",
		"tcp+nosuch:key=hunter2",
		"ssh:host=x,psk=hunter2 ",
	} {
		t.Run(text, func(t *testing.T) {
			_, err := Parse(text)
			if err == nil {
				t.Fatal("parsed")
			}
			if msg := err.Error(); strings.Contains(msg, "hunter2") || !strings.Contains(msg, "REDACTED") {
				t.Errorf("error %q", msg)
			}
		})
	}
}

// TestIsLoopbackName: a hop as layers name it ([user@]host[:port]) is
// this host only when it says so; any other name counts as remote.
func TestIsLoopbackName(t *testing.T) {
	for hop, want := range map[string]bool{
		"127.0.0.1:1080":         true,
		"127.0.0.2":              true,
		"alice@localhost:2222":   true,
		"[::1]:22":               true,
		"::1":                    true,
		"[::1]":                  true,
		"db.localhost":           true,
		"10.77.0.1:1080":         false,
		"alice@127.0.0.1@evil":   false, // the host is what follows the last @
		"proxy.example:3128":     false,
		"localhost.example:3128": false,
		"myalias":                false, // an ssh_config alias may lead anywhere
		"":                       false,
	} {
		if got := isLoopbackName(hop); got != want {
			t.Errorf("isLoopbackName(%q) = %v, want %v", hop, got, want)
		}
	}
}

// TestProxySchemesAgree: the schemes that secret.ReadStack takes for
// proxy URLs are the parser's.
func TestProxySchemesAgree(t *testing.T) {
	got := slices.Sorted(maps.Keys(proxySchemes))
	want := slices.Sorted(slices.Values(secret.ProxySchemes))
	if !slices.Equal(got, want) {
		t.Errorf("parser's schemes %v, secret.ProxySchemes %v", got, want)
	}
}

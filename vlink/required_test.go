package vlink

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name: "test-required", Kind: layer.KindFactory, Summary: "a factory with a required parameter",
		Params: []layer.Param{{Name: "addr", Type: layer.TypeString, Required: true, Doc: "the proxy"}},
		New:    func(a layer.Args) (any, error) { return pathFactory{}, nil },
	})
}

// pathFactory dials nothing: it reports its forward dialer's String, the
// path a factory keys shared state on.
type pathFactory struct{}

type pathError struct{ path string }

func (e pathError) Error() string { return "path " + e.path }

func (pathFactory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	s, _ := forward.(interface{ String() string })
	if s == nil {
		return nil, pathError{"<no String>"}
	}
	return nil, pathError{s.String()}
}

func TestRequiredParam(t *testing.T) {
	_, err := Parse("test-required")
	if !errors.Is(err, ErrBadParam) || !strings.Contains(err.Error(), "missing required parameter addr (the proxy)") {
		t.Fatalf("Parse without the required parameter: %v", err)
	}
	if _, err := Parse("test-required:addr=p:1"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering a required parameter with a default did not panic")
		}
	}()
	layer.Register(layer.Spec{Name: "test-required-bad", Kind: layer.KindFactory, New: func(layer.Args) (any, error) { return nil, nil },
		Params: []layer.Param{{Name: "a", Type: layer.TypeString, Required: true, Default: "x"}}})
}

// TestForwardString checks that a factory's forward dialer describes the
// stack below it, so that ssh can key its shared connections on the path.
func TestForwardString(t *testing.T) {
	d := Dialer{Stack: MustParse("test-required:addr=p:1+test-proxy:addr=q:2")}
	_, err := d.Dial("tcp", "x:1")
	var pe pathError
	if !errors.As(err, &pe) || pe.path != "test-proxy:addr=q:2+tcp" {
		t.Fatalf("dial = %v, want the path test-proxy:addr=q:2+tcp", err)
	}
}

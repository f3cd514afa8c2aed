package layertest_test

import (
	"net"
	"testing"

	"github.com/vlink-dev/vlink/filters/identity"
	"github.com/vlink-dev/vlink/vlink/layer/layertest"
)

// A filter's package runs the whole suite from one test of its own: in
// its conformance_test.go,
//
//	func TestConformance(t *testing.T) {
//		layertest.TestFilter(t, identity.Filter{}, layertest.Options{})
//	}
//
// A filter that frames its stream declares its end marker, so that the
// truncation check holds it to failing a stream cut short:
// layertest.Options{EndMarker: true}.
func ExampleTestFilter() {
	testConformance := func(t *testing.T) {
		layertest.TestFilter(t, identity.Filter{}, layertest.Options{})
	}
	_ = testConformance
}

// Any other layer gives the suite its pairs. Here plain TCP on loopback
// stands for a factory's dialed and accepted connections; a pipe that
// can reach below its layer also sets Cut.
func ExampleTestConn() {
	makePipe := func() (layertest.Pipe, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return layertest.Pipe{}, err
		}
		defer l.Close()
		d, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return layertest.Pipe{}, err
		}
		a, err := l.Accept()
		if err != nil {
			d.Close()
			return layertest.Pipe{}, err
		}
		return layertest.Pipe{Dialer: d, Acceptor: a, Stop: func() { d.Close(); a.Close() }}, nil
	}
	testConformance := func(t *testing.T) {
		layertest.TestConn(t, makePipe, layertest.Options{})
	}
	_ = testConformance
}

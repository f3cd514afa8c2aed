package layertest_test

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/filters/identity"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/layer/layertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestIdentity: a filter without end markers passes, its truncation
// check skipped with the reason.
func TestIdentity(t *testing.T) {
	layertest.TestFilter(t, identity.Filter{}, layertest.Options{})
}

// TestFramed: a framed filter with end markers passes all of it. The
// transfers stop at 3 MiB: TestIdentity runs the 200 MiB one, and this
// filter copies every frame.
func TestFramed(t *testing.T) {
	layertest.TestFilter(t, framed{}, layertest.Options{EndMarker: true, Sizes: []int64{0, 1, 65537, 3<<20 + 11}})
}

// TestTCP runs the suite on plain loopback TCP through TestConn, as a
// factory's test would, with a pipe that cuts below nothing (Cut nil).
func TestTCP(t *testing.T) {
	layertest.TestConn(t, func() (layertest.Pipe, error) {
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
	}, layertest.Options{Sizes: []int64{0, 1 << 20}})
}

// hidden is identity with its connections' Unwrapper hidden, so an abort
// cannot reach the TCP connection below and closes it cleanly.
type hidden struct{}

func (hidden) Client(c net.Conn) (net.Conn, error) { return hide(identity.Filter{}.Client(c)) }
func (hidden) Server(c net.Conn) (net.Conn, error) { return hide(identity.Filter{}.Server(c)) }

func hide(c net.Conn, err error) (net.Conn, error) { return hiddenConn{c}, err }

type hiddenConn struct{ net.Conn }

func (c hiddenConn) CloseWrite() error { return netconn.CloseWrite(c.Conn) }

// broken are layers that break the contract, each with what it declares,
// and the checks that must catch it.
var broken = map[string]struct {
	f        layer.Filter
	opts     layertest.Options
	failures []string
}{
	"identity-without-unwrapper": {hidden{}, layertest.Options{},
		[]string{"Abort/dialer/idle", "Abort/acceptor/idle"}},
	"identity-declaring-end-markers": {identity.Filter{}, layertest.Options{EndMarker: true},
		[]string{"Truncation/dialer", "Truncation/acceptor"}},
	"framed-abort-as-close": {framed{"abort-as-close"}, layertest.Options{EndMarker: true},
		[]string{"Abort/dialer/idle", "Abort/acceptor/idle"}},
	"framed-eof-at-cut": {framed{"eof-at-cut"}, layertest.Options{EndMarker: true},
		[]string{"Truncation/dialer", "Truncation/acceptor"}},
	"framed-undeclared": {framed{}, layertest.Options{},
		[]string{"Truncation/dialer", "Truncation/acceptor"}},
}

const envBroken = "LAYERTEST_BROKEN"

// TestBroken runs the suite on a broken layer when TestCatches asks for
// it in a process of its own; it must fail.
func TestBroken(t *testing.T) {
	name := os.Getenv(envBroken)
	b, ok := broken[name]
	if !ok {
		t.Skip("run by TestCatches")
	}
	b.opts.Sizes = []int64{0, 65537}
	t.Run(name, func(t *testing.T) { layertest.TestFilter(t, b.f, b.opts) })
}

// TestCatches checks that the suite fails each broken layer, in the
// checks that should catch it (and passes the sound ones: TestIdentity,
// TestFramed).
func TestCatches(t *testing.T) {
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBroken$", "-test.v")
			cmd.Env = append(os.Environ(), envBroken+"="+name)
			out, err := cmd.CombinedOutput()
			if _, failed := err.(*exec.ExitError); !failed {
				t.Fatalf("the suite passed %s (err %v):\n%s", name, err, out)
			}
			for _, check := range b.failures {
				if !strings.Contains(string(out), "--- FAIL: TestBroken/"+name+"/"+check+" ") {
					t.Errorf("the suite did not fail %s in %s:\n%s", name, check, out)
				}
			}
		})
	}
}

package layertest

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// A Pipe is a connected pair of a layer's connections, made for one
// check.
type Pipe struct {
	// Dialer is the end that dialed (a filter's Client side), Acceptor
	// the end that accepted (its Server side), each as a program gets
	// it.
	Dialer, Acceptor net.Conn
	// Stop closes both ends and releases whatever the pipe started. It
	// is required.
	Stop func()
	// Cut, where the pipe can reach below its layer, ends the byte
	// stream under the layer in one direction, from the end given
	// (Dialer or Acceptor) to the other, cleanly (a FIN), as the kernel
	// of a dying process or a middlebox would, while the layer above has
	// not ended its stream. The layers above are not told. Nil means the
	// pipe cannot: the truncation check then says so and is skipped.
	Cut func(from net.Conn) error
}

// MakePipe makes a new Pipe, or fails with the reason.
type MakePipe func() (Pipe, error)

// Options say what the layer under test declares, and bound the checks.
// The zero value suits a layer without end markers.
type Options struct {
	// EndMarker declares that the layer ends its stream with a marker of
	// its own (an end frame, a fin block), so that a stream cut below it
	// without the marker is an error at its reader, never io.EOF. A
	// registered layer declares it in its layer.Spec. False: the layer
	// cannot tell a cut stream from an ended one (identity over plain
	// TCP); the truncation check verifies that too, and says so.
	EndMarker bool
	// LosesAborts declares that the pipes' path cannot carry an abort to
	// the peer: a server on the way ends one side with a FIN however the
	// other ended (an SSH server closes a channel's target so, whether
	// the channel was aborted or closed). The abort check then skips,
	// saying so, where the peer reads a clean end. A layer's own
	// connections never need it: it describes servers the layer relays
	// through and does not control.
	LosesAborts bool
	// Handshake is what TestFilter hands a layer.HandshakeFilter on both
	// ends. Zero means a fixed key and transcript, the same on both.
	Handshake layer.Handshake
	// Sizes are the transfer sizes in bytes. Nil means 0, 1, 65535,
	// 65537, 3 MiB + 11 and, unless testing.Short, 200 MiB.
	Sizes []int64
}

func (o Options) sizes() []int64 {
	if o.Sizes != nil {
		return o.Sizes
	}
	sizes := []int64{0, 1, 65535, 65537, 3<<20 + 11}
	if !testing.Short() {
		sizes = append(sizes, 200<<20)
	}
	return sizes
}

// TestConn runs every check of the suite on pipes from mp, each in a
// subtest (see the package doc), from both ends where the check has a
// direction.
func TestConn(t *testing.T, mp MakePipe, opts Options) {
	t.Run("nettest", func(t *testing.T) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			p, err := mp()
			if err != nil {
				return nil, nil, nil, err
			}
			// nettest's BasicIO closes its writing end in a goroutine it
			// does not wait for: the reader is done once that Close has
			// sent the end, and Stop may then close what is below while
			// the Close is still at work, which fails it. Stop waits for
			// the Closes under way.
			var closing sync.WaitGroup
			d, a := &closeTracked{Conn: p.Dialer, wg: &closing}, &closeTracked{Conn: p.Acceptor, wg: &closing}
			return d, a, func() { closing.Wait(); p.Stop() }, nil
		})
	})
	t.Run("Errors", func(t *testing.T) { testErrors(t, mp) })
	for _, size := range opts.sizes() {
		t.Run(fmt.Sprintf("Transfers/%d", size), func(t *testing.T) { testTransfer(t, mp, size) })
	}
	for _, from := range []end{dialer, acceptor} {
		for _, inFlight := range []bool{false, true} {
			name := "idle"
			if inFlight {
				name = "in-flight"
			}
			t.Run(fmt.Sprintf("Abort/%s/%s", from, name), func(t *testing.T) { testAbort(t, mp, opts, from, inFlight) })
		}
	}
	for _, from := range []end{dialer, acceptor} {
		t.Run(fmt.Sprintf("Truncation/%s", from), func(t *testing.T) { testTruncation(t, mp, opts, from) })
	}
}

// closeTracked counts its Closes under way in wg.
type closeTracked struct {
	net.Conn
	wg *sync.WaitGroup
}

func (c *closeTracked) Close() error {
	c.wg.Add(1)
	defer c.wg.Done()
	return c.Conn.Close()
}

// end names one end of a pipe.
type end int

const (
	dialer end = iota
	acceptor
)

func (e end) String() string {
	if e == dialer {
		return "dialer"
	}
	return "acceptor"
}

// ends returns the pipe's end e and its peer.
func (p Pipe) ends(e end) (from, to net.Conn) {
	if e == dialer {
		return p.Dialer, p.Acceptor
	}
	return p.Acceptor, p.Dialer
}

// pipe makes a pipe for a check, stopped when the check ends.
func pipe(t *testing.T, mp MakePipe) Pipe {
	t.Helper()
	p, err := mp()
	if err != nil {
		t.Fatalf("make pipe: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

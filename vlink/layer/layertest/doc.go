// Package layertest checks that a layer's connections keep the contract
// of package layer, in one call, as golang.org/x/net/nettest checks a
// net.Conn and testing/fstest an fs.FS.
//
// A filter's package runs the whole suite from a test of its own; the
// suite makes its pairs of connections over loopback TCP, the filter's
// Client on the dialing end and its Server on the accepting end:
//
//	func TestConformance(t *testing.T) {
//		layertest.TestFilter(t, rot13.Filter{}, layertest.Options{})
//	}
//
// Any other layer (a factory, a multi-link layer, a whole stack) gives
// [TestConn] a [MakePipe] that makes its pairs. Package vlink/layers runs
// the suite that way for every layer in the registry, at the place each
// needs (a proxy, a vlink network); a third-party layer needs neither
// package vlink nor that one.
//
// The suite checks, each in a subtest:
//
//   - nettest: golang.org/x/net/nettest's TestConn: deadlines past,
//     present and future, concurrent I/O, Close unblocking a blocked call;
//   - Errors: a timeout wraps os.ErrDeadlineExceeded and leaves the
//     connection working, I/O after Close is net.ErrClosed, and the peer
//     of a closed end reads io.EOF;
//   - Transfers: 0 B to 200 MiB (3 MiB with -short) both ways at once,
//     each end half-closing when done (CloseWrite), each direction's
//     SHA-256 kept;
//   - Abort: after netconn.Abort on one end, with data in flight and with
//     none, the other end reads only bytes that were sent, then an error
//     (a *net.OpError), never io.EOF; from each end. A path that cannot
//     carry an abort (Options.LosesAborts) is skipped where its peer
//     reads a clean end, saying so;
//   - Truncation: where the pipe can cut the stream below the layer
//     (Pipe.Cut), a layer that declares end markers (Options.EndMarker)
//     makes its reader fail with a *net.OpError, never read io.EOF; a
//     layer that declares none is checked to read io.EOF there, and the
//     subtest is skipped saying that the layer cannot tell a cut stream
//     from an ended one. A pipe that cannot cut is skipped, saying so.
//
// The abort and truncation checks wait at most 10 s for the news to
// reach the other end, and fail naming what they waited for; nothing is
// retried.
package layertest

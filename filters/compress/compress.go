// Package compress provides the compression filters of vlink: "zstd",
// "s2", "deflate" and "lz4", each with a fixed level, and "adaptive", which
// picks the codec and level, or none, as the link, the CPU and the data
// change. Each compresses what a connection writes and decompresses what
// it reads; the peer runs the same filter. They pay off when the link is
// slower than the CPU: bulk transfers over a WAN.
//
// The stream is a sequence of frames (see frame.go), each carrying at most
// [MaxBlock] application bytes compressed on their own, or as they are
// when compressing does not shrink them. So:
//
//   - every Write reaches the peer at once: nothing is held back waiting
//     for more data, and a small write costs one small frame;
//   - incompressible data (already compressed, encrypted) is sent raw, and
//     after repeated failures the writer stops trying for a growing number
//     of blocks, so it costs little more than the framing;
//   - an idle connection holds no codec state and no buffer: encoders and
//     decoders are shared or pooled, buffers are taken from pools only
//     while a frame is in flight;
//   - a reader's memory is bounded whatever the peer claims (a pooled
//     MaxBlock for decoded bytes, 256 KiB to read ahead): a malformed or
//     hostile stream (a decompression bomb, an absurd zstd window) fails
//     the connection with an error matching [ErrCorrupt] inside a
//     *net.OpError naming the codec.
//
// The connections honour the whole net.Conn contract: deadlines (a
// deadline that fires in the middle of a frame loses nothing), concurrent
// Read and Write, Close unblocking both, and half-close with CloseWrite.
//
// # The auto layer
//
// A fixed codec is a guess: zstd triples a 100 Mbit/s link's goodput on
// text, and divides a loopback connection's by twenty. The auto layer
// (AdOC's idea, adaptive online compression) guesses no more. Its frames
// are the same, except that each compressed frame names its codec, so the
// reader follows whatever the writer chooses, block by block; the level
// only matters to the writer. The writer moves on a ladder of rungs: off,
// then codec-level settings from the fastest to the strongest (by default
// s2-1, s2-2, zstd-1, zstd-6; see [AutoConfig]).
//
// AdOC puts a queue between a compressing thread and a sending thread and
// watches it: when data piles up, the link drains slower than the
// compressor produces, so the CPU has time to spare and a stronger level
// pays; when the queue runs dry, the compressor is the bottleneck and a
// faster level, down to none, pays. Our writer has no queue of its own
// (every Write is on the wire, or in the socket, when it returns): the
// socket's send buffer is the queue. The controller watches it from above:
// the time each Write spends compressing and in the socket and, where the
// kernel tells (tcp_info on Linux), how many bytes wait unsent in the
// socket and how fast the peer acknowledges.
//
// Rather than climb blindly from level to level, it keeps a small model,
// updated every epoch (1 MiB of application bytes and 50 ms, or 100 ms
// spent in Write):
//
//   - the link rate B, in wire bytes per second, measured when the link
//     limits the writer: 256 KiB or more wait unsent in the socket, as
//     tcp_info says, the rate being what the peer acknowledged (without
//     tcp_info: the writer spends a good share of its time in the socket,
//     or it is at off, where the socket is all there is, the rate being
//     what it wrote; a writer starved of CPU looks the same, which is why
//     tcp_info is preferred). Otherwise only a lower bound is known, and
//     the estimate grows, doubling every second spent writing, until the
//     link pushes back: that is how a link that became faster is found;
//   - each rung's compression speed C (application bytes per second of
//     CPU), measured whenever the rung compresses, built-in priors scaled
//     to this machine until then;
//   - the data's compressibility: rung j's ratio is 1 + rho_j*kappa, where
//     kappa follows the data (measured every epoch at the current rung;
//     at off, by a probe block) and rho_j, each rung's strength relative
//     to the others, comes from the priors and is refined by probe blocks.
//
// Compression and transmission overlap (the kernel sends while the writer
// compresses the next block), so rung j's predicted goodput is
// min(C_j, B*R_j), and off's is B. At the end of each epoch the controller
// moves to the best rung of the model: down, to a cheaper rung, as soon as
// one is predicted within 3% of the current one; up only for a predicted
// gain of 10%. The asymmetry is the hysteresis: neither move qualifies an
// immediate move back, and equal predictions (random data, where every
// ratio is 1) settle on the cheapest rung. A move may skip rungs, so a
// cold start or a change of data or link reaches the new best rung in an
// epoch or two.
//
// Epochs in which the application, not the link or the CPU, set the pace
// (the writer spent less than half the time in Write) teach nothing about
// the link; idle time does not age the link estimate either. When
// tcp_info shows the peer's receive window holding the sender back, the
// peer reads slower than the link carries: compressing more would only
// give it more to decode, so every rung is predicted at the peer's pace
// and the cheapest wins. A move down that only the grown estimate
// justified is an exploration, and so is the move to the cheaper rung the
// controller makes after 4 s on a rung even when the model says no (a
// rate measured while the writer's own work slows the socket, as on
// loopback where the writing thread does the kernel's work for the peer,
// can make every rung but a cheaper one look right). When an exploration
// does not pay and the controller climbs back, the doubling time doubles,
// up to 4 s (and the forced period with it, up to 16 s), so a connection
// at its best rung pays for a one-epoch exploration every few seconds at
// most. Probe blocks (at most
// one every 200 ms, compressed at another rung and sent as they are,
// since frames name their codec) keep the estimates fresh: at off the
// first codec rung, to notice compressible data again; when the link
// limits, the next stronger rung, whose CPU is free then.
//
// The cost: two or three clock reads per block, a tcp_info read and a few dozen
// floating-point operations per epoch, no allocation, and about 1 KiB per
// connection that has written (the estimates). Control is per direction:
// each side's writer decides for what it sends.
package compress

import (
	"fmt"
	"net"
	"strconv"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	for i := range codecSpecs {
		s := &codecSpecs[i]
		layer.Register(layer.Spec{
			Name:    s.name,
			Kind:    layer.KindFilter,
			Summary: s.summary,
			Params: []layer.Param{{
				Name:    "level",
				Type:    layer.TypeInt,
				Default: strconv.Itoa(s.defLevel),
				Min:     int64(s.minLevel),
				Max:     int64(s.maxLevel),
				Local:   true,
				Doc:     s.levelDoc,
			}},
			New: func(a layer.Args) (any, error) { return New(s.name, a.Int("level")) },
		})
	}
}

// A Filter is one compression layer with its level. It implements
// layer.Filter; both sides of a connection use the same codec, and the
// level only matters to the side that writes.
type Filter struct {
	name  string
	codec blockCodec
}

var _ layer.Filter = (*Filter)(nil)

// New returns the filter for codec ("zstd", "s2", "deflate" or "lz4") at
// the given level. Levels are zstd 1-22 (default 3), s2 1-3 (default 1),
// deflate 1-9 (default 5) and lz4 0-9 (default 0; above 0 is LZ4 HC).
func New(codec string, level int) (*Filter, error) {
	s, err := lookupCodec(codec)
	if err != nil {
		return nil, err
	}
	if level < s.minLevel || level > s.maxLevel {
		return nil, fmt.Errorf("compress: %w: %s level %d is outside [%d, %d]", layer.ErrBadParam, codec, level, s.minLevel, s.maxLevel)
	}
	return &Filter{name: s.name, codec: s.new(level)}, nil
}

// Client wraps the dialing side's connection. The returned connection
// owns c.
func (f *Filter) Client(c net.Conn) (net.Conn, error) { return newConn(c, f.name, f.codec), nil }

// Server wraps the accepting side's connection. The returned connection
// owns c.
func (f *Filter) Server(c net.Conn) (net.Conn, error) { return newConn(c, f.name, f.codec), nil }

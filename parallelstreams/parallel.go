// Package parallelstreams provides the "parallel" layer of vlink: one
// connection striped over several connections of the layers below it
// (substreams), after GridFTP's parallel streams and PadicoTM's
// ParallelStreams. On a long, lossy link a single TCP flow is capped by
// its window and by its reaction to each loss; N flows share the loss and
// add their windows. Where a shaper caps each flow's rate, N flows get N
// caps, whatever their congestion control (BBR included).
//
//	vlink tunnel --stack parallel:streams=8 ...        8 TCP flows
//	vlink tunnel --stack zstd+parallel:streams=8 ...   compress once, then stripe
//	vlink tunnel --stack parallel:streams=16,auto ...  grow from 2 while it helps
//
// It is a vlink multi-link layer: each substream is dialed through the rest
// of the stack below it (so it works over tcp, ssh or any factory, under or
// over compression) and opens with its own hello and a join header naming
// the session; the listener groups substreams into the session with a
// timeout and a cap on what it holds, then treats the session as a new
// connection (see [layer.MultiLink]).
//
// Writes are cut into numbered blocks that go out on whichever substream
// is free, the receiver restores their order in a window of bounded size,
// and credit flows back as the application reads, so a slow reader slows
// the writer instead of filling memory. If a substream fails the whole
// connection fails with an error naming it: the bytes are delivered in
// order or not at all.
package parallelstreams

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Defaults of the layer's parameters.
const (
	DefaultStreams      = 4
	DefaultWindow       = 32 << 20
	DefaultStallTimeout = 60 * time.Second
)

func init() {
	layer.Register(layer.Spec{
		Name:    "parallel",
		Kind:    layer.KindMultiLink,
		Summary: "stripe one connection over several connections of the layers below (parallel streams)",
		Params: []layer.Param{
			{Name: "streams", Type: layer.TypeInt, Default: fmt.Sprint(DefaultStreams), Min: 1, Max: MaxStreams,
				Doc: "number of substreams; with auto, the most it grows to"},
			{Name: "auto", Type: layer.TypeBool, Default: "false",
				Doc: "start with 2 substreams and add more while goodput (either way) keeps improving, up to streams: for a link whose rate per flow is unknown"},
			{Name: "window", Type: layer.TypeSize, Default: "32M", Min: 256 << 10, Max: 256 << 20,
				Doc: "receive window: how far the writer may get ahead of the reader, per direction, and the most the receiver buffers; about 3 times the link's bandwidth-delay product, as a lost packet holds the other substreams' blocks for a round trip or more (32M suits 1 Gbit/s at 80 ms)"},
			{Name: "stall-timeout", Type: layer.TypeDuration, Default: DefaultStallTimeout.String(),
				Min: int64(time.Second), Max: int64(time.Hour), Local: true,
				Doc: "fail the connection when a substream accepts no data for this long (a silently cut path)"},
		},
		EndMarker: true,
		New: func(a layer.Args) (any, error) {
			return &Layer{
				Streams:      a.Int("streams"),
				Auto:         a.Bool("auto"),
				Window:       int(a.Size("window")),
				StallTimeout: a.Duration("stall-timeout"),
			}, nil
		},
	})
}

// A Layer is the parallel layer with its parameters. It implements
// layer.MultiLink.
type Layer struct {
	Streams      int           // substreams, or the most with Auto
	Auto         bool          // grow from 2 while throughput improves
	Window       int           // receive window in bytes
	StallTimeout time.Duration // a substream's write may block this long

	autoFake *autoFake // tests only: drives the auto-grow loop
}

var _ layer.Reserver = (*Layer)(nil)

func (l *Layer) initial() int {
	if l.Auto {
		return min(2, l.Streams)
	}
	return l.Streams
}

// Dial opens the substreams through lower, all at once, and joins them in
// one session.
func (l *Layer) Dial(ctx context.Context, network, address string, lower layer.Lower) (net.Conn, error) {
	var id sessionID
	rand.Read(id[:])
	n := l.initial()
	start := time.Now()
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns[i], errs[i] = l.dialSubstream(ctx, network, address, lower, join{index: i, count: n, max: l.Streams, id: id})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	s := newSession(id, int64(l.Window), l.StallTimeout, conns)
	if l.Auto && l.Streams > n {
		s.grower = &grower{s: s, layer: l, network: network, address: address, lower: lower, id: id,
			fake: l.autoFake, dialed: time.Since(start)}
		s.wg.Add(1)
		go s.grower.run()
	}
	return s, nil
}

// dialSubstream dials one substream and sends its join header.
func (l *Layer) dialSubstream(ctx context.Context, network, address string, lower layer.Lower, j join) (net.Conn, error) {
	c, err := lower.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("substream %d: %w", j.index, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	hdr := j.marshal()
	if _, err := c.Write(hdr[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("substream %d: sending join header: %w", j.index, err)
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}

// Reserve holds room in the listener's table for one more substream from
// j's dialer (see [table.reserve] for the bounds). The listener calls it
// before it accepts the substream's hello, so a full table refuses the
// hello as busy.
func (l *Layer) Reserve(j layer.Junction) (release func(), err error) {
	t := tableOf(j)
	src := sourceOf(j.RemoteAddr())
	if err := t.reserve(src, j.MaxPending(), l.Streams); err != nil {
		return nil, err
	}
	return func() { t.release(src) }, nil
}

// Accept reads a substream's join header and files it with its session,
// which goes to j.Deliver once complete. The substream's room in the
// table was reserved by Reserve.
func (l *Layer) Accept(c net.Conn, j layer.Junction) error {
	go tableOf(j).admit(c, l, j)
	return nil
}

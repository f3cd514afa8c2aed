// Package compress provides vlink's compression filters: "zstd", "s2",
// "deflate" and "lz4" at a fixed level, and "adaptive", which picks the
// codec and level, or none, block by block as the link, the CPU and the
// data change (AdOC's adaptive online compression). Each compresses what
// a connection writes and decompresses what it reads; the peer runs the
// same filter. They pay off where the link is slower than the CPU: bulk
// transfers over a WAN.
//
// The stream is a sequence of frames (frame.go) of at most [MaxBlock]
// application bytes each, compressed on their own, or sent raw when that
// does not shrink them. So every Write reaches the peer at once, an idle
// connection holds no codec state, and a reader's memory stays bounded
// whatever the peer sends: a malformed or hostile stream fails the
// connection with an error matching [ErrCorrupt] inside a *net.OpError
// naming the codec. The connections honour the whole net.Conn contract.
// How the adaptive controller models the link and the CPU and when it
// moves is in control.go and docs/ARCHITECTURE.md §9.
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
			EndMarker: true,
			New:       func(a layer.Args) (any, error) { return New(s.name, a.Int("level")) },
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

package compress

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name:    "adaptive",
		Kind:    layer.KindFilter,
		Summary: "adaptive compression: picks the codec and level, or none, as the link and CPU speeds and the data change",
		Params: []layer.Param{
			{
				Name:    "codecs",
				Type:    layer.TypeString,
				Default: strings.Join(defaultAutoCodecs, "/"),
				Doc:     "the codecs it may use, separated by /: any of zstd, s2, deflate, lz4",
			},
			{
				Name:    "max-level",
				Type:    layer.TypeInt,
				Default: "9",
				Min:     1,
				Max:     22,
				Doc:     "the highest level it uses, in each codec's own scale (zstd 1-22, deflate 1-9, lz4 0-9, s2 1-3)",
			},
		},
		EndMarker: true,
		New: func(a layer.Args) (any, error) {
			return NewAuto(AutoConfig{Codecs: strings.Split(a.String("codecs"), "/"), MaxLevel: a.Int("max-level")})
		},
	})
}

// defaultAutoCodecs: s2 for fast links, zstd for slow ones. lz4 and
// deflate add little: s2 compresses faster than lz4 at the same ratio,
// zstd compresses better than deflate at the same speed and decodes twice
// as fast (filters/BENCHMARKS.txt).
var defaultAutoCodecs = []string{"s2", "zstd"}

// defaultMaxLevel keeps zstd's slowest speed (levels 10-22, 14 MB/s) out:
// it gains 3% of ratio over level 6 for four times the CPU.
const defaultMaxLevel = 9

// AutoConfig configures the auto layer.
type AutoConfig struct {
	// Codecs are the codecs the layer may use: "zstd", "s2", "deflate",
	// "lz4". Nil means s2 and zstd.
	Codecs []string
	// MaxLevel caps the level of every codec, in the codec's own scale.
	// Zero means 9.
	MaxLevel int
}

// Validate reports whether the configuration is usable.
func (c AutoConfig) Validate() error {
	_, err := c.ladder()
	return err
}

// autoCandidates are the settings a ladder is built from: for each codec,
// one level per distinct speed (zstd's levels map to four encoder speeds),
// with its compression speed (MB/s on one core) and ratio on the text
// corpus of the benchmarks (BenchmarkCodec's blocks, headers included).
// The controller takes them as priors only: it measures speed and ratio
// on the live data, and scales the priors of the rungs it has not
// measured.
var autoCandidates = []struct {
	codec        string
	level        int
	speed, ratio float64
}{
	{"s2", 1, 607, 2.739}, {"s2", 2, 303, 2.937}, {"s2", 3, 14, 3.143},
	{"zstd", 1, 217, 4.369}, {"zstd", 3, 146, 4.361}, {"zstd", 6, 56, 4.693}, {"zstd", 10, 14, 4.816},
	{"lz4", 0, 398, 2.796}, {"lz4", 3, 42, 3.339}, {"lz4", 9, 38, 3.339},
	{"deflate", 1, 221, 3.984}, {"deflate", 3, 187, 4.119}, {"deflate", 5, 166, 4.426}, {"deflate", 9, 20, 4.910},
}

// ladder builds the rungs: off, then the candidates of the allowed codecs
// and levels from the fastest to the strongest, without those another
// candidate nearly matches in speed (90%) and beats in ratio, and without
// those that gain less than 2.5% of ratio over the rung below.
func (c AutoConfig) ladder() ([]rung, error) {
	codecs := c.Codecs
	if codecs == nil {
		codecs = defaultAutoCodecs
	}
	maxLevel := c.MaxLevel
	if maxLevel == 0 {
		maxLevel = defaultMaxLevel
	}
	if maxLevel < 1 || maxLevel > 22 {
		return nil, fmt.Errorf("compress: %w: auto max-level %d is outside [1, 22]", layer.ErrBadParam, maxLevel)
	}
	if len(codecs) == 0 {
		return nil, fmt.Errorf("compress: %w: auto needs at least one codec (zstd, s2, deflate, lz4)", layer.ErrBadParam)
	}
	seen := map[string]bool{}
	for _, name := range codecs {
		if _, err := lookupCodec(name); err != nil {
			return nil, fmt.Errorf("%w: codecs=%s: %w", layer.ErrBadParam, strings.Join(codecs, "/"), err)
		}
		if seen[name] {
			return nil, fmt.Errorf("compress: %w: codecs=%s names %s twice", layer.ErrBadParam, strings.Join(codecs, "/"), name)
		}
		seen[name] = true
	}
	var cands []rung
	for _, a := range autoCandidates {
		if !seen[a.codec] || a.level > maxLevel {
			continue
		}
		s, _ := lookupCodec(a.codec)
		cands = append(cands, rung{name: fmt.Sprintf("%s-%d", a.codec, a.level), id: s.id, codec: s.new(a.level), speed: a.speed * 1e6, ratio: a.ratio})
	}
	slices.SortStableFunc(cands, func(a, b rung) int { return cmp.Compare(b.speed, a.speed) })
	rungs := []rung{{name: "off", speed: 0, ratio: 1}}
	for i, r := range cands {
		dominated := false
		for j, o := range cands {
			if j != i && o.speed >= 0.9*r.speed && (o.ratio > r.ratio || o.ratio == r.ratio && j < i) {
				dominated = true
			}
		}
		if !dominated && r.ratio >= 1.025*rungs[len(rungs)-1].ratio {
			rungs = append(rungs, r)
		}
	}
	if len(rungs) > maxRungs {
		rungs = rungs[:maxRungs]
	}
	return rungs, nil
}

// An Auto is the auto layer: a compression filter whose writers choose,
// block by block, the codec and level (or none) that move the most data
// given how fast the link drains and the CPU compresses (see control.go).
// Each compressed frame names its codec, so the reader follows. It
// implements layer.Filter.
type Auto struct {
	rungs []rung
	dec   decoders
	used  []*atomic.Uint64 // each rung's counter, for AdaptiveStats
}

var _ layer.Filter = (*Auto)(nil)

// NewAuto returns the auto layer for cfg.
func NewAuto(cfg AutoConfig) (*Auto, error) {
	rungs, err := cfg.ladder()
	if err != nil {
		return nil, err
	}
	a := &Auto{rungs: rungs}
	for _, r := range rungs[1:] {
		a.dec[r.id] = r.codec
	}
	for _, r := range rungs {
		a.used = append(a.used, rungCounter(r.name))
	}
	return a, nil
}

// Rungs returns the settings the layer moves between, from off to the
// strongest: "off", then codec-level names such as "s2-1" and "zstd-6".
func (a *Auto) Rungs() []string {
	names := make([]string, len(a.rungs))
	for i, r := range a.rungs {
		names[i] = r.name
	}
	return names
}

// Client wraps the dialing side's connection. The returned connection
// owns c.
func (a *Auto) Client(c net.Conn) (net.Conn, error) { return newAutoConn(c, a), nil }

// Server wraps the accepting side's connection. The returned connection
// owns c.
func (a *Auto) Server(c net.Conn) (net.Conn, error) { return newAutoConn(c, a), nil }

func newAutoConn(c net.Conn, a *Auto) *conn {
	cn := newConnDec(c, "adaptive", nil, &a.dec)
	cn.rungs, cn.rungUsed = a.rungs, a.used
	return cn
}

package bench

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

// defaultLinks are the link rates bench answers for without --link, in
// bits per second: a slow WAN, a fast one, a LAN, a data centre.
var defaultLinks = []float64{10e6, 100e6, 1e9, 10e9}

// parseLinks reads --link: comma-separated rates in bits per second,
// with K, M and G suffixes as powers of 1000, as links are sold.
func parseLinks(s string) ([]float64, error) {
	if s == "" {
		return defaultLinks, nil
	}
	var links []float64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		v := strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(part), "bit/s"), "bps")
		mult := 1.0
		switch {
		case strings.HasSuffix(v, "k"):
			mult, v = 1e3, v[:len(v)-1]
		case strings.HasSuffix(v, "m"):
			mult, v = 1e6, v[:len(v)-1]
		case strings.HasSuffix(v, "g"):
			mult, v = 1e9, v[:len(v)-1]
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil || n <= 0 || n*mult > 1e13 {
			return nil, base.Usagef("--link %q: want a rate in bits per second such as 100M or 2.5G", part)
		}
		links = append(links, n*mult)
	}
	slices.Sort(links)
	return links, nil
}

// A linkEstimate is what each stack would carry over a link of one rate.
type linkEstimate struct {
	Rate    float64            `json:"rate_bits_per_s"`
	Data    string             `json:"data"`
	Goodput map[string]float64 `json:"goodput_mb_per_s"` // by stack
	Best    string             `json:"best"`
	// NoDifference: a stack's median beats raw TCP's, but not by more
	// than the rounds' spread, so raw TCP is named.
	NoDifference bool `json:"no_difference,omitempty"`
}

// tieMargin is the least margin by which a stack must beat another to
// be named over it: the model's own approximation, where the rounds
// agree more closely than that.
const tieMargin = 0.05

// linkEstimates models each stack on each link: an application gets the
// lesser of what the stack's CPU work allows (its measured MB/s, both
// ends on this machine) and what the link carries of its bytes (the
// link's rate over the stack's wire bytes per application byte).
//
// The stack with the highest median wins only over those it beats
// beyond the noise: a stack whose fastest round (capped by the link as
// well) reaches the winner's slowest, or whose median is within
// tieMargin of the winner's, cannot be told from it. Among those, raw
// TCP is named if it is one, since no layer is simpler than none (and
// NoDifference says so when a layer's median was higher), else the one
// with the most CPU to spare (the highest MB/s).
func linkEstimates(rows []Row, kinds []string, links []float64) []linkEstimate {
	var out []linkEstimate
	for _, k := range kinds {
		for _, rate := range links {
			e := linkEstimate{Rate: rate, Data: k, Goodput: map[string]float64{}}
			cpu := map[string]float64{}
			lo, hi := map[string]float64{}, map[string]float64{}
			top := ""
			for _, r := range rows {
				if r.Data != k || r.WirePerByte <= 0 {
					continue
				}
				capacity := rate / 8 / 1e6 / r.WirePerByte
				g := min(r.MBps, capacity)
				e.Goodput[r.Stack], cpu[r.Stack] = g, r.MBps
				lo[r.Stack], hi[r.Stack] = g, g
				if len(r.RoundsMBps) > 0 {
					lo[r.Stack], hi[r.Stack] = min(slices.Min(r.RoundsMBps), capacity), min(slices.Max(r.RoundsMBps), capacity)
				}
				if top == "" || g > e.Goodput[top] {
					top = r.Stack
				}
			}
			for _, r := range rows { // in the table's order: raw first
				g, ok := e.Goodput[r.Stack]
				switch {
				case !ok || g < (1-tieMargin)*e.Goodput[top] && hi[r.Stack] < lo[top]:
				case e.Best == "":
					e.Best = r.Stack
				case e.Best != "raw" && cpu[r.Stack] > cpu[e.Best]:
					e.Best = r.Stack
				}
			}
			e.NoDifference = e.Best == "raw" && top != "raw" && e.Goodput[top] > e.Goodput["raw"]
			out = append(out, e)
		}
	}
	return out
}

// printLinkTable prints, for each kind of data and link rate, raw TCP's
// goodput and the best stack's.
func printLinkTable(w io.Writer, est []linkEstimate) {
	fmt.Fprintln(w, "\n# goodput over a link of each rate, estimated: the lesser of MB/s above and the link's rate / WIRE/BYTE")
	rows := [][]string{{"DATA", "LINK", "RAW MB/s", "BEST", "MB/s", "xRAW", "NEXT"}}
	for _, e := range est {
		stacks := make([]string, 0, len(e.Goodput))
		for s := range e.Goodput {
			stacks = append(stacks, s)
		}
		slices.SortFunc(stacks, func(a, b string) int {
			if c := cmp.Compare(e.Goodput[b], e.Goodput[a]); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		next := ""
		for _, s := range stacks {
			if s != e.Best {
				next = fmt.Sprintf("%s %.1f", s, e.Goodput[s])
				break
			}
		}
		raw := e.Goodput["raw"]
		best := e.Best
		if e.NoDifference {
			best += " (no difference)"
		}
		rows = append(rows, []string{e.Data, base.FormatRate(e.Rate), strconv.FormatFloat(raw, 'f', 1, 64), best,
			strconv.FormatFloat(e.Goodput[e.Best], 'f', 1, 64), strconv.FormatFloat(e.Goodput[e.Best]/raw, 'f', 2, 64), next})
	}
	printColumns(w, rows, 2)
	fmt.Fprintln(w, "\n# These estimates take the link to carry what TCP sends. Over a long path with random loss (a WAN,\n"+
		"# Wi-Fi) one TCP flow with the kernel's usual CUBIC carries a fraction of it: end the stack with\n"+
		"# tcp:cc=bbr (Linux; the gateway's side follows), e.g. --stack zstd+tcp:cc=bbr (docs/GUIDE.md, bulk data).")
}

// plotPalette colours the stacks' lines, raw TCP first.
var plotPalette = []string{"#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// writePlot draws, for each kind of data, the estimated goodput of every
// stack against the link rate, both axes logarithmic, as an SVG: one
// panel per kind, one line per stack, from 1 Mbit/s to 100 Gbit/s. A
// plain SVG writer is a few lines; a plotting library would add megabytes
// of fonts to the binary for this one picture.
func writePlot(w io.Writer, rows []Row, kinds []string) error {
	const (
		width, panelH   = 760, 360
		left, right     = 70, 190
		top, bottom     = 40, 50
		xMin, xMax      = 6.0, 11.0 // log10 of bits per second
		points          = 101
		plotW           = width - left - right
		plotH           = panelH - top - bottom
		yMinDecade      = -1.0 // 0.1 MB/s
		yMaxDecadeLimit = 5.0
	)
	var stacks []string
	yMax := 1.0
	for _, r := range rows {
		if !slices.Contains(stacks, r.Stack) {
			stacks = append(stacks, r.Stack)
		}
		yMax = max(yMax, r.MBps)
	}
	yTop := min(math.Ceil(math.Log10(yMax)), yMaxDecadeLimit)
	x := func(l float64) float64 { return left + (l-xMin)/(xMax-xMin)*plotW }
	y := func(g float64) float64 {
		v := math.Log10(max(g, math.Pow(10, yMinDecade)))
		return top + (1-(v-yMinDecade)/(yTop-yMinDecade))*plotH
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, panelH*len(kinds))
	for p, kind := range kinds {
		fmt.Fprintf(&b, `<g transform="translate(0,%d)">`+"\n", p*panelH)
		fmt.Fprintf(&b, `<text x="%d" y="24" font-size="14">Estimated goodput over a link, %s data (vlink bench)</text>`+"\n", left, kind)
		for d := xMin; d <= xMax; d++ {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
				x(d), top, x(d), top+plotH, x(d), top+plotH+18, base.FormatRate(math.Pow(10, d)))
		}
		for d := yMinDecade; d <= yTop; d++ {
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n",
				left, y(math.Pow(10, d)), left+plotW, y(math.Pow(10, d)), left-6, y(math.Pow(10, d))+4, math.Pow(10, d))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">link rate</text>`+"\n", left+plotW/2, top+plotH+38)
		fmt.Fprintf(&b, `<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">MB/s</text>`+"\n", top+plotH/2)
		var links []float64
		for i := range points {
			links = append(links, math.Pow(10, xMin+(xMax-xMin)*float64(i)/(points-1)))
		}
		est := linkEstimates(rows, []string{kind}, links)
		for i, s := range stacks {
			var pts []string
			for j, e := range est {
				if g, ok := e.Goodput[s]; ok {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(math.Log10(links[j])), y(g)))
				}
			}
			if len(pts) == 0 {
				continue
			}
			color := plotPalette[i%len(plotPalette)]
			fmt.Fprintf(&b, `<polyline data-stack=%q fill="none" stroke=%q stroke-width="2" points=%q/>`+"\n", s, color, strings.Join(pts, " "))
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke=%q stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
				left+plotW+12, top+10+i*18, left+plotW+32, top+10+i*18, color, left+plotW+38, top+14+i*18, html.EscapeString(s))
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

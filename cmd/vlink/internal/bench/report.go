package bench

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vlink-dev/vlink/internal/units"
)

// Row is one line of the results.
type Row struct {
	Stack        string    `json:"stack"`
	Data         string    `json:"data"`
	MBps         float64   `json:"mb_per_s"`
	RoundsMBps   []float64 `json:"mb_per_s_rounds"`
	Ratio        float64   `json:"ratio_to_raw"`
	LatencyNs    int64     `json:"latency_ns"`
	LatencyRatio float64   `json:"latency_ratio_to_raw"`
	WirePerByte  float64   `json:"wire_bytes_per_byte"`
}

type Report struct {
	Go         string `json:"go"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Size       int64  `json:"size"`
	Rounds     int    `json:"rounds"`
	Pings      int    `json:"pings"`
	Results    []Row  `json:"results"`
	// Links estimates the goodput of each stack over links of each
	// --link rate (see linkEstimates).
	Links []linkEstimate `json:"links"`
}

// report gives each series its median and its ratio to raw TCP's.
func (o *benchOptions) report(targets []*benchTarget, kinds []string, m benchMeasures) Report {
	r := Report{
		Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, GOMAXPROCS: runtime.GOMAXPROCS(0),
		Size: int64(o.size), Rounds: o.rounds, Pings: o.pings,
	}
	raw := targets[0]
	rawRTT := median(raw.rtts)
	for _, t := range targets {
		rtt := median(t.rtts)
		for _, k := range kinds {
			rounds := m.mbps[benchKey{t.name, k}]
			mbps := medianFloat(rounds)
			r.Results = append(r.Results, Row{
				Stack: t.name, Data: k, MBps: mbps, RoundsMBps: rounds,
				Ratio:        mbps / medianFloat(m.mbps[benchKey{raw.name, k}]),
				LatencyNs:    rtt.Nanoseconds(),
				LatencyRatio: float64(rtt) / float64(rawRTT),
				WirePerByte:  m.wire[benchKey{t.name, k}],
			})
		}
	}
	r.Links = linkEstimates(r.Results, kinds, o.links)
	return r
}

func printBenchTable(w io.Writer, r *Report) {
	fmt.Fprintf(w, "# %s per run, median of %d round(s), %d pings per round; %s %s/%s, GOMAXPROCS=%d\n",
		units.FormatSize(r.Size), r.Rounds, r.Pings, r.Go, r.OS, r.Arch, r.GOMAXPROCS)
	rows := [][]string{{"STACK", "DATA", "MB/s", "MIN..MAX", "xRAW", "LATENCY", "xRAW", "WIRE/BYTE"}}
	for _, row := range r.Results {
		spread := "-"
		if len(row.RoundsMBps) > 1 {
			spread = strconv.FormatFloat(slices.Min(row.RoundsMBps), 'f', 1, 64) + ".." + strconv.FormatFloat(slices.Max(row.RoundsMBps), 'f', 1, 64)
		}
		rows = append(rows, []string{row.Stack, row.Data,
			strconv.FormatFloat(row.MBps, 'f', 1, 64), spread, strconv.FormatFloat(row.Ratio, 'f', 2, 64),
			formatLatency(time.Duration(row.LatencyNs)), strconv.FormatFloat(row.LatencyRatio, 'f', 2, 64),
			strconv.FormatFloat(row.WirePerByte, 'f', 3, 64)})
	}
	printColumns(w, rows, 2)
}

// printColumns prints rows as a table: the first left columns aligned
// left, numbers aligned right.
func printColumns(w io.Writer, rows [][]string, left int) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		b.Reset()
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < left {
				b.WriteString(cell)
				if i < len(row)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad)
				b.WriteString(cell)
			}
		}
		b.WriteByte('\n')
		io.WriteString(w, b.String())
	}
}

func formatLatency(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 1, 64) + "µs"
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianFloat(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

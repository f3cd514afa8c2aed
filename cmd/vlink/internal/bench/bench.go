// Package bench is "vlink bench": it measures every stack on loopback
// against raw TCP (throughput, latency, compression on chosen data),
// reports a table or JSON, and estimates which stack fits which link
// (--links, --plot).
package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/units"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

var Cmd = &cli.Command{
	Name:     "bench",
	Summary:  "measure every stack against raw TCP on loopback: throughput, latency, compression",
	Synopsis: "[--size SIZE] [--stacks LIST] [--data text|random|both] [--rounds N] [--pings N] [--link RATES] [--plot FILE] [--json]",
	About: `
Measures, on loopback and with no setup, what each stack costs and gains
against raw TCP (net.Dial to net.Listen), which is measured in the same run
as the baseline. It starts its own servers: a raw TCP one and a VLink
listener that mirrors whatever stack it is dialed with; each drains what it
receives, or echoes it for the latency probe.

For each stack and each kind of data it reports:

  MB/s       application bytes per second (10^6 bytes), sent in 128 KiB
             writes until --size, the median of --rounds rounds
  MIN..MAX   the slowest and fastest round: how much noise there is
  xRAW       that throughput divided by raw TCP's on the same data
  LATENCY    median round trip of a 1-byte message (--pings per round)
  xRAW       that latency divided by raw TCP's (above 1 is slower)
  WIRE/BYTE  bytes on the wire per application byte, handshake and framing
             included: below 1 is what compression saves

The data is deterministic: "text" is generated application logs (log lines
and JSON records), "random" does not compress (like encrypted or already
compressed payloads); both repeat every 16 MiB. Stacks run in turn, rounds
interleaved, so that drift on a shared machine affects all alike. Both
ends share this machine's CPUs, so a compressing stack pays for both
sides; on a real link only the link's speed is shared.

Loopback answers "what does a stack cost", not "which stack for my link":
there compression can only lose. So a second table answers that, for each
--link rate (10M, 100M, 1G and 10G by default) and kind of data: the
goodput each stack would reach over such a link, estimated as the lesser
of its MB/s here (the CPU's limit) and the link's rate divided by its
WIRE/BYTE (the link's limit), and the best stack. A stack wins over
another only beyond the noise: where its slowest round beats the other's
fastest (each capped by the link), and by 5% or more. Of the stacks that
cannot be told from the fastest, raw TCP is named if it is one ("raw (no
difference)" when a layer's median was higher), else the one with the
most CPU to spare. The estimate is as good as the assumption
that the CPU cost measured here, both ends on one machine, is what each
side pays; adaptive, which compresses little on a link as fast as
loopback, will compress more on a slow one than its row assumes.

Progress goes to stderr, the tables (or --json) to stdout.
`,
	Examples: `
  # Every registered filter and multi-link layer, 64 MiB of each kind of
  # data, 5 rounds:
  vlink bench

  # A quick look at two stacks, for scripts:
  vlink bench --size 8M --stacks tcp,zstd:level=1,lz4 --data text --rounds 1 --json
`,
	Flags: base.WithEnv(benchFlags),
}

const (
	benchChunk      = 128 << 10 // bytes per Write: a compression filter's whole block
	benchCorpusMax  = 16 << 20  // data repeats beyond this
	benchWarmup     = 50        // pings before the measured ones
	benchPingBatch  = 50        // pings to one target before the next one's turn
	benchWarmupSize = 4 << 20   // bytes sent unmeasured before the first round
	benchIOTimeout  = 5 * time.Minute
)

type benchOptions struct {
	size          sizeFlag
	stacks, data  string
	rounds, pings int
	json          bool
	link, plot    string
	links         []float64 // --link, parsed
}

func benchFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &benchOptions{size: 64 << 20}
	fs.Var(&o.size, "size", "send `SIZE` bytes per stack, data kind and round; K, M and G suffixes are powers of 1024")
	fs.StringVar(&o.stacks, "stacks", "", "measure the stacks in the comma-separated `LIST` besides raw TCP, e.g. tcp,zstd:level=1,lz4 (default: tcp, and every registered filter and multi-link layer on tcp; factories that need a proxy or an SSH server are measured only when listed)")
	fs.StringVar(&o.data, "data", "both", "send `KIND` of data: text, random or both")
	fs.IntVar(&o.rounds, "rounds", 5, "measure every stack `N` times, interleaved, and report the median")
	fs.IntVar(&o.pings, "pings", 1000, "time `N` 1-byte round trips per stack and round for the latency")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&o.plot, "plot", "", "also draw the estimated goodput of every stack against the link rate, 1 Mbit/s to 100 Gbit/s, into the SVG `FILE` (default: none)")
	fs.StringVar(&o.link, "link", "", "estimate the goodput of every stack over links of the comma-separated `RATES` in bits per second (K, M, G: powers of 1000), and name the best stack for each (default 10M,100M,1G,10G)")
	return func(ctx context.Context, e *base.Env) int {
		if err := o.run(ctx, e); err != nil {
			return base.Fail(e, "vlink bench", err)
		}
		return base.ExitOK
	}
}

// A benchTarget is one thing measured: raw TCP, or a stack.
type benchTarget struct {
	name  string
	dial  func(ctx context.Context) (net.Conn, error)
	close func()          // releases what dial keeps; nil if nothing
	wire  *atomic.Int64   // bytes its server read from the wire
	idle  func()          // waits until its server has no connection left
	rtts  []time.Duration // every round's
}

func (o *benchOptions) check() (stacks []vlink.Stack, kinds []string, err error) {
	if o.size <= 0 {
		return nil, nil, base.Usagef("--size must be positive")
	}
	if o.rounds < 1 || o.pings < 1 {
		return nil, nil, base.Usagef("--rounds and --pings must be at least 1")
	}
	if o.links, err = parseLinks(o.link); err != nil {
		return nil, nil, err
	}
	switch o.data {
	case "text", "random":
		kinds = []string{o.data}
	case "both":
		kinds = []string{"text", "random"}
	default:
		return nil, nil, base.Usagef("--data %q: want text, random or both", o.data)
	}
	texts := splitStacks(o.stacks)
	if o.stacks == "" {
		texts = []string{"tcp"}
		for _, s := range layer.Specs() {
			if s.Kind == layer.KindFilter || s.Kind == layer.KindMultiLink {
				texts = append(texts, s.Name)
			}
		}
	}
	seen := map[string]bool{}
	for _, t := range texts {
		if t == "raw" {
			continue // always measured
		}
		s, err := vlink.Parse(t)
		if err != nil {
			return nil, nil, base.Usagef("--stacks: %v", err)
		}
		if !seen[s.String()] {
			seen[s.String()] = true
			stacks = append(stacks, s)
		}
	}
	return stacks, kinds, nil
}

// splitStacks splits a comma-separated list of stacks. A stack's own
// parameters are comma-separated too, so a part that starts with
// key=value continues the stack before it: "zstd:level=3,x=1,lz4" is
// "zstd:level=3,x=1" and "lz4".
func splitStacks(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if eq := strings.IndexByte(part, '='); eq > 0 && len(out) > 0 && !strings.ContainsAny(part[:eq], ":+") {
			out[len(out)-1] += "," + part
			continue
		}
		out = append(out, part)
	}
	return out
}

func (o *benchOptions) run(ctx context.Context, e *base.Env) error {
	stacks, kinds, err := o.check()
	if err != nil {
		return err
	}
	size := int64(o.size)
	srv, err := startBenchServers()
	if err != nil {
		return err
	}
	defer srv.close()
	targets := benchTargets(srv, stacks)
	defer func() {
		for _, t := range targets {
			if t.close != nil {
				t.close() // a mux session lives as long as its Dialer
			}
		}
	}()

	progress := func(format string, args ...any) {
		if e.Level <= slog.LevelInfo {
			fmt.Fprintf(e.Stderr, "bench: "+format+"\n", args...)
		}
	}
	progress("%d stacks besides raw TCP, %s of %s per run, %d round(s); GOMAXPROCS=%d",
		len(stacks), units.FormatSize(size), strings.Join(kinds, " and "), o.rounds, runtime.GOMAXPROCS(0))
	corpora := benchCorpora(kinds, size)
	// An unmeasured pass first: connections, pools and codecs warm up.
	for _, t := range targets {
		for _, k := range kinds {
			warm := min(size, benchWarmupSize)
			if _, _, err := benchThroughput(ctx, t, corpora[k], warm); err != nil {
				return fmt.Errorf("%s, %s data: %w", t.name, k, err)
			}
		}
	}
	m, err := o.measure(ctx, targets, kinds, corpora, progress)
	if err != nil {
		return interrupted(ctx, err)
	}
	report := o.report(targets, kinds, m)
	if o.plot != "" {
		if err := o.writePlot(&report, kinds); err != nil {
			return err
		}
		progress("wrote %s", o.plot)
	}
	if o.json {
		enc := json.NewEncoder(e.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	printBenchTable(e.Stdout, &report)
	printLinkTable(e.Stdout, report.Links)
	return nil
}

// benchCorpora returns the data of each kind, up to benchCorpusMax bytes.
func benchCorpora(kinds []string, size int64) map[string][]byte {
	n := int(min(size, benchCorpusMax))
	corpora := map[string][]byte{}
	for _, k := range kinds {
		if k == "text" {
			corpora[k] = textCorpus(n)
		} else {
			corpora[k] = randomCorpus(n)
		}
	}
	return corpora
}

// benchTargets returns raw TCP, the baseline, then one target per stack.
func benchTargets(srv *benchServers, stacks []vlink.Stack) []*benchTarget {
	targets := []*benchTarget{{
		name: "raw",
		dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", srv.raw.Addr().String())
		},
		wire: &srv.rawWire,
		idle: srv.waitIdle,
	}}
	for _, s := range stacks {
		d := &vlink.Dialer{Stack: s, Key: srv.key}
		targets = append(targets, &benchTarget{
			name: s.String(),
			dial: func(ctx context.Context) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", srv.vl.Addr().String())
			},
			close: func() { d.Close() },
			wire:  &srv.vlWire,
			idle:  srv.waitIdle,
		})
	}
	return targets
}

// benchKey names one series: a target and a kind of data.
type benchKey struct{ target, kind string }

// benchMeasures are what the rounds measured.
type benchMeasures struct {
	mbps map[benchKey][]float64 // every round's throughput
	wire map[benchKey]float64   // wire bytes per application byte, last round
}

// measure runs the rounds: each target's throughput on each kind of data,
// then every target's latency, so that drift on the machine affects all
// alike.
func (o *benchOptions) measure(ctx context.Context, targets []*benchTarget, kinds []string, corpora map[string][]byte,
	progress func(string, ...any)) (benchMeasures, error) {
	size := int64(o.size)
	m := benchMeasures{mbps: map[benchKey][]float64{}, wire: map[benchKey]float64{}}
	for round := 1; round <= o.rounds; round++ {
		for _, t := range targets {
			var line strings.Builder
			for _, k := range kinds {
				took, w, err := benchThroughput(ctx, t, corpora[k], size)
				if err != nil {
					return m, fmt.Errorf("%s, %s data: %w", t.name, k, err)
				}
				key := benchKey{t.name, k}
				rate := float64(size) / took.Seconds() / 1e6
				m.mbps[key] = append(m.mbps[key], rate)
				m.wire[key] = float64(w) / float64(size)
				fmt.Fprintf(&line, "  %s %.1f MB/s, wire %.3f", k, rate, m.wire[key])
			}
			progress("round %d/%d  %-14s%s", round, o.rounds, t.name, line.String())
		}
		if err := benchLatency(ctx, targets, o.pings); err != nil {
			return m, err
		}
		var line strings.Builder
		for _, t := range targets {
			fmt.Fprintf(&line, "  %s %s", t.name, formatLatency(median(t.rtts[len(t.rtts)-o.pings:])))
		}
		progress("round %d/%d  latency%s", round, o.rounds, line.String())
	}
	return m, nil
}

// benchThroughput sends size bytes of corpus (repeated as needed) and
// returns the time from the first byte to the server's acknowledgement of
// the last, and the bytes the server read from the wire.
func benchThroughput(ctx context.Context, t *benchTarget, corpus []byte, size int64) (time.Duration, int64, error) {
	// The server's count is shared by its connections: the last bytes of
	// an earlier one (a filter's end frame, sent as it closes) must be
	// in before the count starts again.
	t.idle()
	t.wire.Store(0)
	c, err := t.dial(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	stop := netconn.InterruptOnDone(ctx, c)
	defer stop()
	c.SetDeadline(time.Now().Add(benchIOTimeout))
	if _, err := c.Write([]byte{modeDrain}); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	for sent := int64(0); sent < size; {
		off := int(sent % int64(len(corpus)))
		end := min(len(corpus), off+benchChunk, off+int(size-sent))
		n, err := c.Write(corpus[off:end])
		sent += int64(n)
		if err != nil {
			return 0, 0, err
		}
	}
	if err := netconn.CloseWrite(c); err != nil {
		return 0, 0, err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return 0, 0, fmt.Errorf("waiting for the server to count the bytes: %w", err)
	}
	took := time.Since(start)
	if got := int64(binary.BigEndian.Uint64(ack[:])); got != size {
		return 0, 0, fmt.Errorf("the server received %d bytes of %d", got, size)
	}
	if ctx.Err() != nil {
		return 0, 0, ctx.Err()
	}
	return took, t.wire.Load(), nil
}

// benchLatency times n 1-byte round trips to each target, after a few
// unmeasured ones, and appends them to the target's rtts. Targets take
// turns every few pings, so that a change in the machine's load or
// power state affects them all alike.
func benchLatency(ctx context.Context, targets []*benchTarget, n int) error {
	conns := make([]net.Conn, len(targets))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			if c != nil {
				netconn.Interrupt(c)
			}
		}
	})
	defer stop()
	b := []byte{'x'}
	ping := func(c net.Conn) (time.Duration, error) {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return 0, fmt.Errorf("waiting for the echo: %w", err)
		}
		return time.Since(start), nil
	}
	for i, t := range targets {
		c, err := t.dial(ctx)
		if err != nil {
			return fmt.Errorf("%s, latency: %w", t.name, err)
		}
		c.SetDeadline(time.Now().Add(benchIOTimeout))
		conns[i] = c
		if _, err := c.Write([]byte{modeEcho}); err != nil {
			return fmt.Errorf("%s, latency: %w", t.name, err)
		}
		for range benchWarmup {
			if _, err := ping(c); err != nil {
				return fmt.Errorf("%s, latency: %w", t.name, err)
			}
		}
	}
	for done := 0; done < n; done += benchPingBatch {
		for i, t := range targets {
			for range min(benchPingBatch, n-done) {
				rtt, err := ping(conns[i])
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return fmt.Errorf("%s, latency: %w", t.name, err)
				}
				t.rtts = append(t.rtts, rtt)
			}
		}
	}
	return nil
}

// interrupted reports an interrupted run as such rather than as the I/O
// error the interruption caused.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	return err
}

// sizeFlag is a byte count with an optional K, M or G suffix (powers of
// 1024).
type sizeFlag int64

func (s *sizeFlag) String() string { return units.FormatSize(int64(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := units.ParseSize(v)
	if err != nil {
		return fmt.Errorf("%q is %w", v, err)
	}
	*s = sizeFlag(n)
	return nil
}

// writePlot writes --plot.
func (o *benchOptions) writePlot(r *Report, kinds []string) error {
	f, err := os.Create(o.plot)
	if err != nil {
		return err
	}
	if err := writePlot(f, r.Results, kinds); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

var ceilingCmd = &cli.Command{
	Name:     "ceiling",
	Summary:  "measure the highest rate the delay line carries",
	Synopsis: "[--time DURATION] [--rounds N]",
	About: `
Measures the lab's own ceiling: iperf3 through a delay line with no delay
next to a veth pair in the same run (1 and 8 streams), then through a delay
line with 50 ms RTT (1, 8 and 16 streams), first unlimited (the line is the
bottleneck), then rate-limited at 1, 2 and 4 Gbit/s (8 streams). Prints
each run with the CPU seconds per GB of the iperf3 processes and of this
process (the delay line, and the kernel receive path its writes run), and
the delay line's own added delay (median and 99th percentile, to a factor
of two). The ceiling is the highest limit at which the line added at most
1 ms to the median packet (and the path delivered 80% of the limit), in at
least half of the rounds. Figures taken through the lab are only trustworthy below it. Takes about 10 x --time
x --rounds.
`,
	Examples: `
  vlink-lab ceiling
  vlink-lab ceiling --time 10s --rounds 3
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		dur := fs.Duration("time", 5*time.Second, "length of each iperf3 run")
		rounds := fs.Int("rounds", 1, "repeat the series this many times, interleaved")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if *dur < time.Second || *rounds < 1 {
				return usagef("--time at least 1s, --rounds at least 1")
			}
			printHeader(e)
			ms, err := lab.Ceiling(ctx, lab.CeilingConfig{Time: *dur, Rounds: *rounds, Progress: func(m lab.Measurement) { printRow(e, m) }})
			if err != nil {
				return err
			}
			veth := lab.MaxRate(ms, lab.PathVeth)
			d0 := lab.MaxRate(ms, lab.PathDelay0)
			d50 := lab.MaxRate(ms, lab.PathDelay50ms)
			fmt.Fprintf(e.stdout, "\nunlimited: the delay line carried up to %.2f Gbit/s with no delay (veth: %.2f Gbit/s, ratio %.2f) and up to %.2f Gbit/s at 50 ms RTT\n",
				d0/1e9, veth/1e9, d0/veth, d50/1e9)
			if c := lab.Carried(ms); c > 0 {
				fmt.Fprintf(e.stdout, "ceiling: at 50 ms RTT the delay line carries a %v link (median added delay <= %v, >= 80%% delivered, in most rounds)\n", c, lab.CeilingLateLimit)
			} else {
				fmt.Fprintf(e.stdout, "ceiling: at 50 ms RTT the delay line did not carry even a 1gbit link (median added delay <= %v, >= 80%% delivered): figures through it are suspect\n", lab.CeilingLateLimit)
			}
			return nil
		}
	}),
}

func printHeader(e *env) {
	fmt.Fprintf(e.stdout, "%-24s %7s %7s %10s %9s %12s %12s %16s\n", "path", "limit", "streams", "Mbit/s", "retrans", "iperf3 s/GB", "lab s/GB", "late p50/p99")
}

func printRow(e *env, m lab.Measurement) {
	late := "-"
	if m.LateP99 > 0 {
		late = fmt.Sprintf("%v/%v", m.LateP50, m.LateP99)
	}
	limit := "-"
	if m.Limit > 0 {
		limit = m.Limit.String()
	}
	fmt.Fprintf(e.stdout, "%-24s %7s %7d %10.1f %9d %12.3f %12.3f %16s\n",
		m.Label, limit, m.Streams, m.Mbps(), m.Retransmits, m.CPUPerGB(), m.LabCPUPerGB(), late)
}

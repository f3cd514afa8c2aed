package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

var benchCmd = &cli.Command{
	Name:     "bench",
	Summary:  "measure iperf3 through profiles, with 1 to N streams",
	Synopsis: "[--streams LIST] [--time DURATION] [--rounds N] PROFILE|FILE...",
	About: `
Brings each topology up in turn and runs iperf3 from --client to --server
with each number of parallel streams (-P), printing the rate received, the
sender's retransmissions, the CPU seconds per GB of the two iperf3 processes
(from their rusage) and of this process (the delay lines), and the delay
line's own added delay. These are the baselines for what parallel TCP can do
on each link.
`,
	Examples: `
  vlink-lab bench wan50 wan50-clean
  vlink-lab bench --streams 1 --time 20s wan100m
  vlink-lab bench --iperf3-args "-C bbr" wan50
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		streams := fs.String("streams", "1,2,4,8,16", "comma-separated numbers of parallel streams")
		dur := fs.Duration("time", 10*time.Second, "length of each iperf3 run")
		rounds := fs.Int("rounds", 1, "repeat each topology's series this many times, interleaved")
		client := fs.String("client", "client", "host that runs the iperf3 client")
		server := fs.String("server", "server", "host that runs the iperf3 server")
		reverse := fs.Bool("reverse", false, "the server sends (iperf3 -R)")
		extra := fs.String("iperf3-args", "", "more iperf3 client arguments, space-separated")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) == 0 {
				return usagef("want at least one PROFILE or FILE")
			}
			var ps []int
			for _, s := range strings.Split(*streams, ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 128 {
					return usagef("--streams: %q is not a number from 1 to 128", s)
				}
				ps = append(ps, n)
			}
			if *dur < time.Second || *rounds < 1 {
				return usagef("--time at least 1s, --rounds at least 1")
			}
			var topos []lab.Topology
			for _, a := range args {
				t, err := loadTopology(a)
				if err != nil {
					return err
				}
				topos = append(topos, t)
			}
			for i, t := range topos {
				l, err := lab.Up(ctx, t)
				if err != nil {
					return err
				}
				if i > 0 {
					fmt.Fprintln(e.stdout)
				}
				fmt.Fprintf(e.stdout, "%s: %s\n", args[i], t.About)
				printHeader(e)
				byStreams := map[int][]lab.Measurement{}
				for range *rounds {
					for _, p := range ps {
						res, err := l.Iperf3(ctx, lab.Iperf3{Client: *client, Server: *server, Streams: p, Time: *dur,
							Reverse: *reverse, Args: strings.Fields(*extra)})
						if err != nil {
							l.Close()
							return err
						}
						m := lab.Measurement{Label: args[i], Streams: p, Limit: clientRate(t, *client, *reverse), Iperf3Result: res}
						printRow(e, m)
						byStreams[p] = append(byStreams[p], m)
					}
				}
				if *rounds > 1 {
					printSummary(e, ps, byStreams)
				}
				if err := l.Close(); err != nil {
					return err
				}
			}
			return nil
		}
	}),
}

// clientRate is the rate limit of the first link of the client's, in the
// direction iperf3 sends, for the table; 0 if none.
func clientRate(t lab.Topology, client string, reverse bool) lab.Bitrate {
	for _, l := range t.Links {
		ab, ba := l.Shapes()
		switch {
		case l.A == client && !reverse, l.B == client && reverse:
			return ab.Rate
		case l.B == client && !reverse, l.A == client && reverse:
			return ba.Rate
		}
	}
	return 0
}

// printSummary prints the median of each series over the rounds, with
// the range of the rate.
func printSummary(e *env, ps []int, by map[int][]lab.Measurement) {
	fmt.Fprintf(e.stdout, "median of %d rounds:\n", len(by[ps[0]]))
	fmt.Fprintf(e.stdout, "%7s %10s %21s %9s %12s %12s\n", "streams", "Mbit/s", "(min..max)", "retrans", "iperf3 s/GB", "lab s/GB")
	for _, p := range ps {
		ms := by[p]
		med := func(f func(lab.Measurement) float64) float64 {
			v := make([]float64, len(ms))
			for i, m := range ms {
				v[i] = f(m)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		rate := func(m lab.Measurement) float64 { return m.Mbps() }
		lo, hi := ms[0].Mbps(), ms[0].Mbps()
		for _, m := range ms {
			lo, hi = min(lo, m.Mbps()), max(hi, m.Mbps())
		}
		fmt.Fprintf(e.stdout, "%7d %10.1f %21s %9.0f %12.3f %12.3f\n", p, med(rate), fmt.Sprintf("(%.1f..%.1f)", lo, hi),
			med(func(m lab.Measurement) float64 { return float64(m.Retransmits) }),
			med(func(m lab.Measurement) float64 { return m.CPUPerGB() }),
			med(func(m lab.Measurement) float64 { return m.LabCPUPerGB() }))
	}
}

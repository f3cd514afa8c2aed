package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/vlink-dev/vlink/integration/lab"
	"github.com/vlink-dev/vlink/internal/cli"
)

// loadTopology reads a profile name or a topology file. A file that
// does not parse or validate is a usage error.
func loadTopology(arg string) (lab.Topology, error) {
	if _, err := os.Stat(arg); err == nil && (strings.ContainsAny(arg, "/.") || !slices.Contains(lab.Profiles(), arg)) {
		t, err := lab.LoadTopology(arg)
		if errors.Is(err, lab.ErrTopology) {
			return t, usagef("%v", err)
		}
		return t, err
	}
	t, err := lab.Profile(arg)
	if err != nil {
		return lab.Topology{}, usagef("%q is neither a profile (%s) nor a topology file", arg, strings.Join(lab.Profiles(), ", "))
	}
	return t, nil
}

var upCmd = &cli.Command{
	Name:     "up",
	Summary:  "bring a topology up and hold it until stopped",
	Synopsis: "[--detach] [--seed N] PROFILE|FILE",
	About: `
Brings up a built-in profile ("vlink-lab profiles" lists them) or a topology
file (TOML; "vlink-lab profiles NAME" prints one to start from), prints its
hosts and addresses, and holds it (the delay lines run in this process)
until SIGINT or SIGTERM, then tears it down: namespaces, devices and the
processes left in them.

With --detach, it holds the lab in a background process and returns once
the lab is up; "vlink-lab down" stops it. Labs whose owner died (a crash,
SIGKILL) are removed by the next "up" or by "down".
`,
	Examples: `
  vlink-lab up wan50                  # in one terminal; Ctrl-C takes it down
  vlink-lab up --detach wan50-clean   # in the background
  vlink-lab profiles wan50 > my.toml && vlink-lab up my.toml
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		detach := fs.Bool("detach", false, "hold the lab in a background process and return once it is up")
		seed := fs.Uint64("seed", 0, "seed of the random loss and jitter, to repeat a run (0: random)")
		readyFD := fs.Int("ready-fd", -1, "(internal) report readiness on this descriptor")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) != 1 {
				return usagef("want one PROFILE or FILE, got %d arguments", len(args))
			}
			topo, err := loadTopology(args[0])
			if err != nil {
				return err
			}
			if *seed != 0 {
				topo.Seed = *seed
			}
			if *detach {
				return detachUp(e, args[0], *seed)
			}
			var ready *os.File
			if *readyFD >= 0 {
				ready = os.NewFile(uintptr(*readyFD), "ready")
			}
			l, err := lab.Up(ctx, topo)
			if err != nil {
				if ready != nil {
					fmt.Fprintf(ready, "error %s\n", err)
				}
				return err
			}
			defer l.Close()
			if ready != nil {
				fmt.Fprintf(ready, "ok %s\n", l.ID())
				ready.Close()
			} else {
				printLab(e, l.ID(), topo)
				fmt.Fprintf(e.stdout, "\nHolding the lab; Ctrl-C (or \"vlink-lab down %s\") takes it down.\n", l.ID())
			}
			<-ctx.Done()
			if err := l.Close(); err != nil {
				return err
			}
			if ready == nil {
				fmt.Fprintf(e.stdout, "lab %s down\n", l.ID())
			}
			return nil
		}
	}),
}

// detachUp starts "vlink-lab up" in a new session, waits until it says
// the lab is up (or why not) and prints the lab.
func detachUp(e *env, arg string, seed uint64) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(exe, "up", "--ready-fd", "3", "--seed", strconv.FormatUint(seed, 10), arg)
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = detachAttr()
	if err := cmd.Start(); err != nil {
		w.Close()
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	cmd.Process.Release()
	status, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch status {
	case "ok":
		infos, err := lab.List()
		if err != nil {
			return err
		}
		for _, inf := range infos {
			if inf.ID == rest {
				printInfo(e, inf)
				fmt.Fprintf(e.stdout, "\nHeld by process %d; \"vlink-lab down %s\" takes it down.\n", inf.PID, inf.ID)
				return nil
			}
		}
		return fmt.Errorf("lab %s is up but has no state file", rest)
	case "error":
		return errors.New(rest)
	}
	return errors.New("the background process ended before the lab was up")
}

func printLab(e *env, id string, t lab.Topology) {
	infos, _ := lab.List()
	for _, inf := range infos {
		if inf.ID == id {
			printInfo(e, inf)
			return
		}
	}
}

func printInfo(e *env, inf lab.Info) {
	name := inf.Name
	if name == "" {
		name = "(unnamed)"
	}
	fmt.Fprintf(e.stdout, "lab %s: %s\n", inf.ID, name)
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  HOST\tADDRESS\tNAMESPACE")
	for _, h := range inf.Hosts {
		addr := "-"
		if len(h.Addrs) > 0 {
			var s []string
			for _, a := range h.Addrs {
				s = append(s, a.String())
			}
			addr = strings.Join(s, ",")
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", h.Name, addr, h.Netns)
	}
	tw.Flush()
	for _, lk := range inf.Links {
		kind := "veth"
		if lk.DelayLine {
			kind = "delay line"
		}
		if lk.AtoB == lk.BtoA {
			fmt.Fprintf(e.stdout, "  link %s-%s: %s, %s each way\n", lk.A, lk.B, kind, lk.AtoB)
		} else {
			fmt.Fprintf(e.stdout, "  link %s-%s: %s, %s->%s %s; %s->%s %s\n", lk.A, lk.B, kind, lk.A, lk.B, lk.AtoB, lk.B, lk.A, lk.BtoA)
		}
	}
	if len(inf.Hosts) >= 2 && len(inf.Hosts[1].Addrs) > 0 {
		a, b := inf.Hosts[0], inf.Hosts[len(inf.Hosts)-1]
		fmt.Fprintf(e.stdout, "\nRun commands in a host:\n  vlink-lab exec %s iperf3 -s -D\n  vlink-lab exec %s iperf3 -c %s\n",
			b.Name, a.Name, b.Addrs[0])
		fmt.Fprintf(e.stdout, "  ip netns exec %s ss -ti    # or ip netns exec directly\n", a.Netns)
	}
}

var execCmd = &cli.Command{
	Name:     "exec",
	Summary:  "run a command in a host of a lab",
	Synopsis: "[--lab ID] HOST [--] COMMAND [ARG...]",
	About: `
Runs COMMAND in HOST's network namespace (through "ip netns exec") and exits
with its status. With one lab up, --lab is not needed. Processes left in a
lab's namespaces are killed when the lab goes down.
`,
	Examples: `
  vlink-lab exec server iperf3 -s -D
  vlink-lab exec client iperf3 -c 10.77.0.2 -t 10 -P 4
  vlink-lab exec --lab 4242-0 client -- ping -c 3 10.77.0.2
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		id := fs.String("lab", "", "the lab's `ID` (\"vlink-lab list\" shows them); needed when several are up")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			if len(args) < 2 {
				return usagef("want HOST and COMMAND")
			}
			host, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
				if len(argv) == 0 {
					return usagef("want a COMMAND after --")
				}
			}
			inf, err := findLab(*id, host)
			if err != nil {
				return err
			}
			cmd := exec.Command("ip", append([]string{"netns", "exec", inf.Host(host).Netns}, argv...)...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
			// SIGINT from a terminal reaches the command too; exec waits
			// for it rather than leaving it behind.
			err = cmd.Run()
			var xe *exec.ExitError
			if errors.As(err, &xe) {
				code := xe.ExitCode()
				if code < 0 {
					code = 128 + exitSignal(xe)
				}
				return &cli.ExitError{Code: code}
			}
			return err
		}
	}),
}

// findLab finds the live lab that has host: the one named by id, or the
// only one up.
func findLab(id, host string) (lab.Info, error) {
	infos, err := lab.List()
	if err != nil {
		return lab.Info{}, err
	}
	var live []lab.Info
	for _, inf := range infos {
		if id != "" && inf.ID == id {
			if inf.Host(host) == nil {
				return lab.Info{}, usagef("lab %s has no host %q (hosts: %s)", id, host, hostNames(inf))
			}
			return inf, nil
		}
		if inf.Alive && !inf.Orphan {
			live = append(live, inf)
		}
	}
	if id != "" {
		return lab.Info{}, fmt.Errorf("no lab %s (\"vlink-lab list\" shows the labs)", id)
	}
	switch len(live) {
	case 0:
		return lab.Info{}, errors.New("no lab is up (start one with \"vlink-lab up PROFILE\")")
	case 1:
		if live[0].Host(host) == nil {
			return lab.Info{}, usagef("lab %s has no host %q (hosts: %s)", live[0].ID, host, hostNames(live[0]))
		}
		return live[0], nil
	}
	var ids []string
	for _, inf := range live {
		ids = append(ids, inf.ID)
	}
	return lab.Info{}, usagef("%d labs are up (%s): choose one with --lab", len(live), strings.Join(ids, ", "))
}

func hostNames(inf lab.Info) string {
	var n []string
	for _, h := range inf.Hosts {
		n = append(n, h.Name)
	}
	return strings.Join(n, ", ")
}

var listCmd = &cli.Command{
	Name:     "list",
	Summary:  "list the labs on this machine",
	Synopsis: "[--json]",
	About: `
Lists the labs on this machine: running ones, and stale ones whose owner died
(which "vlink-lab down" or the next "up" removes).
`,
	Examples: `
  vlink-lab list
  vlink-lab list --json | jq '.[].hosts'
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		asJSON := fs.Bool("json", false, "print the labs as JSON")
		return func(ctx context.Context, e *env, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			infos, err := lab.List()
			if err != nil {
				return err
			}
			if *asJSON {
				type entry struct {
					lab.Info
					State string `json:"state"`
				}
				out := []entry{}
				for _, inf := range infos {
					out = append(out, entry{inf, state(inf)})
				}
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			if len(infos) == 0 {
				fmt.Fprintln(e.stdout, "no labs")
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tNAME\tHOSTS\tOWNER")
			for _, inf := range infos {
				var hosts []string
				for _, h := range inf.Hosts {
					if len(h.Addrs) > 0 {
						hosts = append(hosts, h.Name+"="+h.Addrs[0].String())
					} else {
						hosts = append(hosts, h.Name)
					}
				}
				owner := strconv.Itoa(inf.PID)
				if inf.Owner != "" {
					owner += " " + inf.Owner
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", inf.ID, state(inf), inf.Name, strings.Join(hosts, " "), owner)
			}
			return tw.Flush()
		}
	}),
}

func state(inf lab.Info) string {
	switch {
	case inf.Orphan && inf.Alive:
		return "setting-up"
	case inf.Orphan:
		return "stale"
	case inf.Alive:
		return "running"
	}
	return "stale"
}

// heldByCommand reports whether a lab is held by "vlink-lab up", which a
// SIGTERM takes down cleanly.
func heldByCommand(inf lab.Info) bool {
	f := strings.Fields(inf.Owner)
	return len(f) >= 2 && filepath.Base(f[0]) == "vlink-lab" && f[1] == "up"
}

var downCmd = &cli.Command{
	Name:     "down",
	Summary:  "take labs down",
	Synopsis: "[--all] [ID...]",
	About: `
Takes labs down. Without an ID: every lab held by "vlink-lab up" (they get
SIGTERM and tear their lab down) and every stale lab (whose owner died).
Labs of other live processes (a running "go test", say) are left alone
unless named by ID or with --all: then their namespaces are removed under
them, without signalling the process.
`,
	Examples: `
  vlink-lab down
  vlink-lab down 4242-0
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		all := fs.Bool("all", false, "also take down labs of other live processes")
		wait := fs.Duration("wait", 10*time.Second, "how long a \"vlink-lab up\" gets to take its lab down after SIGTERM before the lab is removed under it")
		return func(ctx context.Context, e *env, args []string) error {
			infos, err := lab.List()
			if err != nil {
				return err
			}
			want := map[string]bool{}
			for _, a := range args {
				want[a] = true
			}
			var errs []error
			found := map[string]bool{}
			for _, inf := range infos {
				named := want[inf.ID]
				found[inf.ID] = true
				switch {
				case len(want) > 0 && !named:
					continue
				case inf.Alive && !inf.Orphan && heldByCommand(inf):
					if err := stopHolder(ctx, inf, *wait); err != nil {
						errs = append(errs, err)
						continue
					}
					fmt.Fprintf(e.stdout, "lab %s: down (stopped vlink-lab up, pid %d)\n", inf.ID, inf.PID)
					continue
				case inf.Alive && !named && !*all:
					fmt.Fprintf(e.stdout, "lab %s: left alone, its owner runs (pid %d: %s); name it or use --all\n", inf.ID, inf.PID, inf.Owner)
					continue
				}
				if err := lab.Remove(inf); err != nil {
					errs = append(errs, err)
					continue
				}
				what := "stale"
				if inf.Alive {
					what = fmt.Sprintf("removed under its owner, pid %d", inf.PID)
				}
				fmt.Fprintf(e.stdout, "lab %s: down (%s)\n", inf.ID, what)
			}
			for _, a := range args {
				if !found[a] {
					errs = append(errs, fmt.Errorf("no lab %s", a))
				}
			}
			return errors.Join(errs...)
		}
	}),
}

// stopHolder sends SIGTERM to the "vlink-lab up" holding a lab and waits
// for the lab to go; if it does not in time, the lab is removed anyway.
func stopHolder(ctx context.Context, inf lab.Info, wait time.Duration) error {
	if err := terminate(inf.PID); err != nil {
		return lab.Remove(inf)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		infos, err := lab.List()
		if err != nil {
			return err
		}
		gone := true
		for _, i := range infos {
			if i.ID == inf.ID {
				gone = false
			}
		}
		if gone {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return lab.Remove(inf)
}

var profilesCmd = &cli.Command{
	Name:     "profiles",
	Summary:  "list the built-in topologies, or print one as a file",
	Synopsis: "[NAME]",
	About: `
Without NAME, lists the built-in profiles. With NAME, prints that profile as
a topology file (TOML), to copy and change.
`,
	Examples: `
  vlink-lab profiles
  vlink-lab profiles wan50 > my.toml
`,
	Args: true,
	Flags: withEnv(func(fs *flag.FlagSet) func(context.Context, *env, []string) error {
		return func(ctx context.Context, e *env, args []string) error {
			switch len(args) {
			case 0:
				tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', 0)
				for _, n := range lab.Profiles() {
					t, _ := lab.Profile(n)
					fmt.Fprintf(tw, "%s\t%s\n", n, t.About)
				}
				return tw.Flush()
			case 1:
				t, err := lab.Profile(args[0])
				if err != nil {
					return usagef("%v", err)
				}
				b, err := toml.Marshal(t)
				if err != nil {
					return err
				}
				_, err = e.stdout.Write(b)
				return err
			}
			return usagef("want at most one NAME")
		}
	}),
}

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

package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
)

var routeCmd = &cli.Command{
	Name:     "route",
	Summary:  "show which way vlink takes to a destination, and why",
	Synopsis: "[flags] HOST:PORT",
	About: `
Connects to HOST:PORT as vlink.Dial, vlink tunnel and vlink exec would,
by the user's configuration (VLINK_CONFIG, default
~/.config/vlink/config.toml, and the VLINK_* variables), and explains
the choice: the route that matched and, for a best-effort route (try =
[...]), every way it raced: when it started, how long it ran and how it
ended, and which one won. Then it closes the connection; nothing is sent.

A best-effort route starts its first way at once and each next one 250 ms
later, or as soon as every way started so far has failed; the first to
connect wins and the others are stopped. The way that won is tried first
for 10 minutes, and a way that failed goes last for 30 s: --count 2 shows
the second dial using what the first learnt. VLINK_PATHS_ONLY and
VLINK_PATHS_EXCLUDE (comma-separated: "direct", a layer's name such as
ssh, or a way's whole text) narrow every best-effort route, and the
paths to nodes: reverse, splice, relay.

A node's address (NODE.vlink.alt:PORT) is reached through the vlink
network (--node, --relay): a table shows each path the network races
(reverse, splice, relay): whether the dial offered it and why not, when
the node's step for it came, and which won. The path that won is
remembered for 10 minutes and the paths that lost to it are left out:
--count 2 shows that too.

Exit status 0 if a way connected, 1 if none did.
`,
	Examples: `
  # With a route such as
  #   [[route]]
  #   host = "db.corp.example"
  #   try = ["direct", "ssh:host=bastion.corp.example"]
  vlink route db.corp.example:5432

  # Which path reaches a node, from this node:
  vlink route --node laptop --relay relay.example:7100 --node-key-file laptop.key web.vlink.alt:8000
`,
	Flags: base.WithEnv(routeFlags),
	Args:  true,
}

type routeOptions struct {
	timeout time.Duration
	count   int
	keyFile string // the network key, to derive the node's key from
	node    base.NodeOptions
}

func routeFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &routeOptions{}
	fs.DurationVar(&o.timeout, "dial-timeout", 10*time.Second, "give up after `DURATION`, handshakes included")
	fs.IntVar(&o.count, "count", 1, "dial `N` times in a row, to see what the dialer remembers between dials")
	base.NodeFlags(fs, &o.node, "to reach NODE.vlink.alt:PORT through the relay")
	base.ReverseFlag(fs, &o.node)
	fs.StringVar(&o.keyFile, "key-file", "", "the network key in `FILE` (mode 600), to derive the node's key from, as serve and tunnel do; needs --node (default: --node-key-file, or the configuration's key)")
	return func(ctx context.Context, e *base.Env) int {
		ok, err := o.run(ctx, e)
		if err != nil {
			return base.Fail(e, "vlink route", err)
		}
		if !ok {
			return base.ExitFailure
		}
		return base.ExitOK
	}
}

func (o *routeOptions) run(ctx context.Context, e *base.Env) (bool, error) {
	if len(e.Args) != 1 {
		return false, base.Usagef("want one destination, HOST:PORT (got %d arguments)", len(e.Args))
	}
	dest := e.Args[0]
	if err := base.CheckHostPort(dest); err != nil {
		return false, base.Usagef("%v", err)
	}
	if o.timeout <= 0 || o.count < 1 {
		return false, base.Usagef("--dial-timeout wants a positive duration, --count at least 1")
	}
	cfg, err := vlink.DefaultConfig()
	if err != nil {
		return false, err
	}
	_, _, isNode := vlink.SplitNodeAddr(dest)
	if o.keyFile != "" && !isNode {
		return false, base.Usagef("--key-file is the network key a node's key derives from: it goes with --node, to reach a node (NODE.vlink.alt:PORT); %s is dialed by the configuration, with its key", dest)
	}
	d := &vlink.Dialer{Config: cfg, Timeout: o.timeout}
	defer d.Close()
	if isNode {
		if !o.node.Given() {
			return false, base.Usagef("%s names a node of a vlink network: join it with --node NAME --relay HOST:PORT (and --node-key-file)", dest)
		}
		networkKey := cfg.Key
		if o.keyFile != "" {
			if networkKey, err = vlink.ReadKeyFile(o.keyFile); err != nil {
				return false, err
			}
		}
		node, err := o.node.Connect(ctx, e, networkKey)
		if err != nil {
			return false, err
		}
		defer node.Close()
		d.Network, d.Member = node, o.node.Member()
	}
	source := cfg.Source
	if source == "" {
		source = "no configuration file"
	}
	fmt.Fprintf(e.Stdout, "to %s (configuration: %s)\n", dest, source)
	ok := true
	for i := range o.count {
		if o.count > 1 {
			fmt.Fprintf(e.Stdout, "\ndial %d of %d\n", i+1, o.count)
		}
		start := time.Now()
		c, rep, err := d.DialReport(ctx, "tcp", dest)
		took := time.Since(start)
		if c != nil {
			c.Close()
		}
		printReport(e, rep, err)
		printLadder(e, rep.Ladder)
		switch {
		case err != nil:
			fmt.Fprintf(e.Stdout, "no connection after %v: %v\n", round(took), err)
			ok = false
		case rep.Path != "" && rep.Path != rep.Way:
			fmt.Fprintf(e.Stdout, "connected in %v by %s, path %s\n", round(took), wayLabel(rep.Way), rep.Path)
		default:
			fmt.Fprintf(e.Stdout, "connected in %v by %s\n", round(took), wayLabel(rep.Way))
		}
	}
	return ok, nil
}

// printReport prints the route and each attempt of a dial: the ways in
// full, then a table that names them by number and layers.
func printReport(e *base.Env, rep *vlink.RouteReport, err error) {
	if len(rep.Attempts) == 0 {
		if rep.Rule == "" && err != nil {
			// The dial failed before it had a route (a node the network
			// could not reach, say): say why rather than name none.
			fmt.Fprintf(e.Stdout, "route: none: %s\n", oneLine(err.Error()))
			return
		}
		fmt.Fprintf(e.Stdout, "route: %s\n", rep.Rule)
		return
	}
	rule, _, _ := strings.Cut(rep.Rule, " try=")
	fmt.Fprintf(e.Stdout, "route: %s, ways in the order tried:\n", rule)
	w := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	for i, a := range rep.Attempts {
		fmt.Fprintf(w, "  %d\t%s\n", i+1, a.Way)
	}
	w.Flush()
	fmt.Fprintln(w, "  #\tway\tstart\ttook\tresult\tnote")
	for i, a := range rep.Attempts {
		start, took, result := round(a.Start).String(), round(a.Took).String(), ""
		switch {
		case a.Won:
			result = "connected, taken"
		case a.Stopped:
			result = "stopped: another way won"
		case a.Err != nil:
			result = "failed: " + oneLine(a.Err.Error())
		case !a.Started:
			start, took, result = "-", "-", "not needed"
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\n", i+1, wayLabel(a.Way), start, took, result, a.Note)
	}
	w.Flush()
}

// printLadder prints the paths of a dial to a node.
func printLadder(e *base.Env, ladder []vlink.PathStep) {
	if len(ladder) == 0 {
		return
	}
	fmt.Fprintln(e.Stdout, "paths to the node, in the order it tries them (reverse at once, splice 100 ms later, relay 500 ms later):")
	w := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  path\toffered\tat\tresult")
	for _, s := range ladder {
		offered, at, result := "no", "-", s.Note
		if s.Offered {
			offered = "yes"
		}
		if s.At > 0 {
			at = round(s.At).String()
		}
		switch {
		case s.Won:
			result = "connected, taken"
		case s.Offered && result == "":
			result = "not taken: another path came first"
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", s.Path, offered, at, oneLine(result))
	}
	w.Flush()
}

// wayLabel names a way by its layers, without their parameters and the
// implied tcp: ssh, zstd+socks5, direct.
func wayLabel(way string) string {
	s, err := vlink.Parse(way)
	if err != nil || len(s.Layers) == 0 {
		return way
	}
	var names []string
	for _, l := range s.Layers {
		names = append(names, l.Name)
	}
	if len(names) > 1 && names[len(names)-1] == "tcp" {
		names = names[:len(names)-1] // implied
	}
	return strings.Join(names, "+")
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

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
// SIGTERM takes down cleanly: this program, under its own name or
// installed under another (its owner runs this executable).
func heldByCommand(inf lab.Info) bool {
	f := strings.Fields(inf.Owner)
	if len(f) < 2 || f[1] != "up" {
		return false
	}
	if filepath.Base(f[0]) == "vlink-lab" {
		return true
	}
	owner, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", inf.PID))
	self, err2 := os.Executable()
	return err == nil && err2 == nil && owner == self
}

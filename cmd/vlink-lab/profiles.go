package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"

	"github.com/pelletier/go-toml/v2"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

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

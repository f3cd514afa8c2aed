package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

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

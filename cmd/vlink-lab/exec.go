package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
)

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

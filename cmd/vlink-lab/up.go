package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/lab"
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

// Command vlink-lab brings up the WAN lab of package integration/lab by
// hand: hosts in network namespaces, joined by veth pairs or by a
// user-space delay line with a round-trip time, jitter, loss and a rate
// limit; runs commands in its hosts; takes it down; and measures the
// lab's own ceiling and iperf3 baselines through it.
//
// Run "vlink-lab --help" or "vlink-lab COMMAND --help" for the usage;
// USAGE.txt beside this file holds all of it. It needs Linux and root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Exit codes, the same for every command but exec, which exits with the
// command's own status.
const (
	exitOK      = 0 // success, including --help and "up" stopped by a signal
	exitFailure = 1 // a runtime failure: cannot bring the lab up, a run failed
	exitUsage   = 2 // a usage error: bad flag, missing argument
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one ends the process at once.
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// A command is one subcommand.
type command struct {
	name     string
	summary  string // one line, for the top-level list
	synopsis string // after "vlink-lab NAME"
	about    string // what it does, for --help
	examples string // commands that run as written
	// flags defines the command's flags on fs and returns what runs it
	// with the positional arguments.
	flags func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) error
}

type env struct {
	stdout, stderr io.Writer
}

var commands = []*command{upCmd, execCmd, listCmd, downCmd, profilesCmd, ceilingCmd, benchCmd}

func lookupCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const exitCodesHelp = `Exit codes:
  0  success (also --help, and "up" stopped by SIGINT or SIGTERM)
  1  runtime failure
  2  usage error
  "exec" exits with the command's own status.
`

// run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "vlink-lab: no command given\n\n")
		topUsage(stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(rest) > 0 {
			if c := lookupCommand(rest[0]); c != nil {
				return runCommand(ctx, c, []string{"--help"}, stdout, stderr)
			}
			return usageError(stderr, "vlink-lab", fmt.Sprintf("unknown command %q", rest[0]))
		}
		topUsage(stdout)
		return exitOK
	}
	c := lookupCommand(name)
	if c == nil {
		if strings.HasPrefix(name, "-") {
			return usageError(stderr, "vlink-lab", fmt.Sprintf("flag %s given before a command", name))
		}
		return usageError(stderr, "vlink-lab", fmt.Sprintf("unknown command %q", name))
	}
	return runCommand(ctx, c, rest, stdout, stderr)
}

func topUsage(w io.Writer) {
	fmt.Fprint(w, `vlink-lab emulates wide-area links between network namespaces on one Linux
machine: hosts joined by veth pairs, or by a user-space delay line that adds
a round-trip time, jitter and loss, with tbf rate limits and nftables
firewalls. It needs root.

Usage:
  vlink-lab COMMAND [flags] [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "vlink-lab COMMAND --help" for a command's flags and examples.

Examples:
  vlink-lab up --detach wan50
  vlink-lab exec server iperf3 -s -D
  vlink-lab exec client iperf3 -c 10.77.0.2 -P 4
  vlink-lab down

`+exitCodesHelp)
}

// runCommand parses a command's flags and runs it.
func runCommand(ctx context.Context, c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vlink-lab "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, help goes to stdout
	fs.Usage = func() {}
	runner := c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		return usageError(stderr, "vlink-lab "+c.name, err.Error())
	}
	e := &env{stdout: stdout, stderr: stderr}
	if err := runner(ctx, e, fs.Args()); err != nil {
		return fail(e, "vlink-lab "+c.name, err)
	}
	return exitOK
}

// usageError reports a usage error and returns exitUsage.
func usageError(w io.Writer, who, msg string) int {
	fmt.Fprintf(w, "%s: %s\n", who, msg)
	fmt.Fprintf(w, "Run \"%s --help\" for usage.\n", who)
	return exitUsage
}

// errUsage marks an error in the command line, as opposed to one met
// while running: it makes the command exit with exitUsage.
type errUsage struct{ msg string }

func (e *errUsage) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &errUsage{fmt.Sprintf(format, args...)}
}

// errExit makes the command exit with a given status, having said
// everything already (exec passes its command's status on).
type errExit struct{ code int }

func (e *errExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// fail reports err and returns the exit code it calls for.
func fail(e *env, who string, err error) int {
	var ue *errUsage
	if errors.As(err, &ue) {
		return usageError(e.stderr, who, ue.msg)
	}
	var ee *errExit
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(e.stderr, "%s: %v\n", who, err)
	return exitFailure
}

func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: vlink-lab %s %s\n\n", c.name, c.synopsis)
	fmt.Fprint(w, strings.TrimLeft(c.about, "\n"))
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Usage, "(internal)") {
			flags = append(flags, f)
		}
	})
	sort.SliceStable(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	fmt.Fprint(w, "\nFlags:\n")
	for _, f := range flags {
		arg, usage := flag.UnquoteUsage(f)
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool {
			arg = ""
		}
		fmt.Fprintf(w, "  --%s", f.Name)
		if arg != "" {
			fmt.Fprintf(w, " %s", arg)
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "\n%s", wrap(usage, "      ", 78))
	}
	fmt.Fprintf(w, "  -h, --help\n      print this help and exit\n")
	if c.examples != "" {
		fmt.Fprint(w, "\nExamples:\n")
		fmt.Fprint(w, strings.TrimLeft(c.examples, "\n"))
	}
	fmt.Fprint(w, "\n"+exitCodesHelp)
}

// wrap fills text into lines of at most width columns, each starting
// with indent.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(text) {
		if n > 0 && n+1+len(word) > width {
			b.WriteByte('\n')
			n = 0
		}
		if n == 0 {
			b.WriteString(indent)
			n = len(indent)
		} else {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	b.WriteByte('\n')
	return b.String()
}

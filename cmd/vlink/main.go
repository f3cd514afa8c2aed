// Command vlink is the single binary of the vlink project: it serves VLink
// stacks on a port and forwards what it accepts (serve), carries local TCP
// connections through a stack (tunnel), measures every stack on loopback
// against raw TCP (bench), and lists what it knows (layers, version).
//
// Run "vlink --help" or "vlink COMMAND --help" for the usage; USAGE.txt
// beside this file holds all of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// Exit codes, the same for every command.
const (
	exitOK      = 0 // success, including --help and a shutdown by signal
	exitFailure = 1 // a runtime failure: cannot listen, a benchmark failed
	exitUsage   = 2 // a usage error: bad flag, missing or conflicting flags
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, restore the default so a second one
		// ends the process at once instead of waiting for the grace period.
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// A command is one subcommand: its help text and what runs it.
type command struct {
	name     string
	summary  string // one line, for the top-level list
	synopsis string // after "vlink NAME"
	about    string // what it does, for --help
	examples string // commands that run as written
	// flags defines the command's flags on fs and returns the function
	// that runs it once they are parsed.
	flags func(fs *flag.FlagSet) func(ctx context.Context, env *env) int
	// args: the command takes arguments after its flags (env.args), as
	// exec takes the program to run.
	args bool
}

// env is what a command runs with.
type env struct {
	stdout, stderr io.Writer
	log            *slog.Logger
	level          slog.Level
	args           []string // after the flags, for commands that take them
}

var commands = []*command{serveCmd, tunnelCmd, socksCmd, execCmd, benchCmd, layersCmd, versionCmd}

func lookupCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

const exitCodesHelp = `Exit codes:
  0  success (also --help, and a server stopped by SIGINT or SIGTERM)
  1  runtime failure
  2  usage error
`

// run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "vlink: no command given\n\n")
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
			return usageError(stderr, "vlink", fmt.Sprintf("unknown command %q", rest[0]))
		}
		topUsage(stdout)
		return exitOK
	case "-version", "--version":
		name = "version"
	}
	c := lookupCommand(name)
	if c == nil {
		if strings.HasPrefix(name, "-") {
			return usageError(stderr, "vlink", fmt.Sprintf("flag %s given before a command", name))
		}
		return usageError(stderr, "vlink", fmt.Sprintf("unknown command %q", name))
	}
	return runCommand(ctx, c, rest, stdout, stderr)
}

func topUsage(w io.Writer) {
	fmt.Fprint(w, `vlink carries TCP connections through stacks of layers (compression now;
forwarding, proxies and firewall crossing as they are added), with a VLink
peer mirroring the stack on the other side.

Usage:
  vlink COMMAND [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "vlink COMMAND --help" for a command's flags and examples.

Examples:
  vlink bench --size 16M
  vlink layers

`+exitCodesHelp)
}

// runCommand parses a command's flags and runs it.
func runCommand(ctx context.Context, c *command, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vlink "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, help goes to stdout
	fs.Usage = func() {}
	level := levelFlag{slog.LevelInfo}
	fs.Var(&level, "log-level", "log at `LEVEL` and above: debug, info, warn or error")
	runner := c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, c, fs)
			return exitOK
		}
		return usageError(stderr, "vlink "+c.name, err.Error())
	}
	if fs.NArg() > 0 && !c.args {
		return usageError(stderr, "vlink "+c.name, fmt.Sprintf("unexpected argument %q (every option is a --flag)", fs.Arg(0)))
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level.Level}))
	return runner(ctx, &env{stdout: stdout, stderr: stderr, log: log, level: level.Level, args: fs.Args()})
}

// usageError reports a usage error and returns exitUsage.
func usageError(w io.Writer, who, msg string) int {
	fmt.Fprintf(w, "%s: %s\n", who, msg)
	fmt.Fprintf(w, "Run \"%s --help\" for usage.\n", who)
	return exitUsage
}

// errUsage marks an error in the command line, as opposed to one met while
// running: it makes the command exit with exitUsage.
type errUsage struct{ msg string }

func (e *errUsage) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &errUsage{fmt.Sprintf(format, args...)}
}

// fail reports err and returns the exit code it calls for.
func fail(e *env, who string, err error) int {
	var ue *errUsage
	if errors.As(err, &ue) {
		return usageError(e.stderr, who, ue.msg)
	}
	fmt.Fprintf(e.stderr, "%s: %v\n", who, err)
	return exitFailure
}

func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: vlink %s %s\n\n", c.name, c.synopsis)
	fmt.Fprint(w, strings.TrimLeft(c.about, "\n"))
	fmt.Fprint(w, "\nFlags:\n")
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	sort.SliceStable(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		arg, usage := flag.UnquoteUsage(f)
		if _, isBool := f.Value.(interface{ IsBoolFlag() bool }); isBool {
			arg = ""
		}
		fmt.Fprintf(w, "  --%s", f.Name)
		if arg != "" {
			fmt.Fprintf(w, " %s", arg)
		}
		if f.DefValue != "" {
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

// wrap fills text into lines of at most width columns, each starting with
// indent.
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

// levelFlag is a --log-level value.
type levelFlag struct{ slog.Level }

func (l *levelFlag) String() string { return strings.ToLower(l.Level.String()) }

func (l *levelFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "debug":
		l.Level = slog.LevelDebug
	case "info":
		l.Level = slog.LevelInfo
	case "warn", "warning":
		l.Level = slog.LevelWarn
	case "error":
		l.Level = slog.LevelError
	default:
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, " ") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// graceVar defines the servers' shutdown grace period flag.
func graceVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "grace", 5*time.Second,
		"on SIGINT or SIGTERM, stop accepting and give open connections this `DURATION` to finish before closing them")
}

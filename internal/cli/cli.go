// Package cli is the command-line frame the project's binaries share
// (vlink, vlink-lab): subcommands with their own flags, --help written
// from those flags, usage errors that say how to get help, and exit codes
// scripts can trust.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes, the same for every command unless it passes on another
// program's status (see ExitError).
const (
	ExitOK      = 0 // success, including --help and a server stopped by a signal
	ExitFailure = 1 // a runtime failure
	ExitUsage   = 2 // a usage error: bad flag, missing or conflicting flags
)

// A Runner runs a command once its flags are parsed, with the arguments
// after them, and returns its exit code, or -N to end the process by
// signal N: a command that ran a program passes on the signal that killed
// it, as env(1) would (Main does that; Run returns -N as it is).
type Runner func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// A Command is one subcommand: its help text and what runs it.
type Command struct {
	Name     string
	Summary  string // one line, for the program's command list
	Synopsis string // after "PROGRAM NAME" in the usage line
	About    string // what it does, for --help
	Examples string // commands that run as written
	// Flags defines the command's flags on fs and returns what runs it.
	// Flags whose usage starts with "(internal)" are left out of --help.
	Flags func(fs *flag.FlagSet) Runner
	// Args says the command takes arguments after its flags; without it,
	// an argument is a usage error.
	Args bool
	// ArgValues are the words its argument may be, for the completion
	// scripts ("bash", "zsh"); nil completes file names.
	ArgValues []string
	// ExitCodes replaces the program's closing paragraph in this
	// command's --help, for a command whose exit codes differ (one that
	// passes on another program's status). Empty: the program's.
	ExitCodes string
	// OwnSignals says the command takes SIGINT and SIGTERM itself (it
	// passes them on to a program it runs): Main does not make them
	// cancel its context.
	OwnSignals bool
}

// An Entry is a name and what it is, for a manual page's list.
type Entry struct{ Name, Doc string }

// A Program is a binary made of subcommands.
type Program struct {
	Name      string
	Intro     string // the top of --help, before the usage line
	Usage     string // after the program's name: "COMMAND [flags]"
	Examples  string // for the top-level --help
	ExitCodes string // the closing paragraph of every --help
	Commands  []*Command
	// Environment and Files are the manual page's ENVIRONMENT and FILES
	// sections: what the program reads, each with what it does.
	Environment, Files []Entry
	// Aliases maps top-level words to commands ("--version": "version").
	Aliases map[string]string
	// AtExit, if set, runs once the command returned, before Main exits:
	// what the process must end cleanly, where it would only be dropped.
	AtExit func()
}

// Main runs the program with the process's arguments and exits with its
// code, or ends by the signal a code -N names. SIGINT and SIGTERM cancel
// the context the command runs with, and a second signal ends the process
// at once, unless the command has OwnSignals.
func (p *Program) Main() {
	args := os.Args[1:]
	ctx := context.Background()
	if c := p.commandOf(args); c == nil || !c.OwnSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-ctx.Done()
			stop() // restore the default: the next signal kills
		}()
	}
	code := p.Run(ctx, args, os.Stdout, os.Stderr)
	if p.AtExit != nil {
		p.AtExit()
	}
	if code < 0 {
		code = dieBySignal(syscall.Signal(-code))
	}
	os.Exit(code)
}

// commandOf returns the command args run, or nil (help, no command).
func (p *Program) commandOf(args []string) *Command {
	if len(args) == 0 {
		return nil
	}
	name := args[0]
	if alias, ok := p.Aliases[name]; ok {
		name = alias
	}
	return p.lookup(name)
}

// Run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do, except to a
// command with OwnSignals.
func (p *Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: no command given\n\n", p.Name)
		p.usage(stderr)
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(rest) > 0 {
			if c := p.lookup(rest[0]); c != nil {
				return p.runCommand(ctx, c, []string{"--help"}, stdout, stderr)
			}
			return UsageError(stderr, p.Name, fmt.Sprintf("unknown command %q", rest[0]))
		}
		p.usage(stdout)
		return ExitOK
	}
	if alias, ok := p.Aliases[name]; ok {
		name = alias
	}
	c := p.lookup(name)
	if c == nil {
		if strings.HasPrefix(name, "-") {
			return UsageError(stderr, p.Name, fmt.Sprintf("flag %s given before a command", name))
		}
		return UsageError(stderr, p.Name, fmt.Sprintf("unknown command %q", name))
	}
	return p.runCommand(ctx, c, rest, stdout, stderr)
}

// Help is the program's whole help as a user pages through it: "PROGRAM
// --help" and what it prints, then the same for every command. The
// USAGE.txt beside each binary holds it.
func (p *Program) Help() string {
	var b strings.Builder
	b.WriteString("$ " + p.Name + " --help\n")
	p.usage(&b)
	for _, c := range p.Commands {
		b.WriteString("\n$ " + p.Name + " " + c.Name + " --help\n")
		p.runCommand(context.Background(), c, []string{"--help"}, &b, io.Discard)
	}
	return b.String()
}

func (p *Program) lookup(name string) *Command {
	for _, c := range p.Commands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (p *Program) usage(w io.Writer) {
	width := 0
	for _, c := range p.Commands {
		width = max(width, len(c.Name))
	}
	fmt.Fprintf(w, "%s\nUsage:\n  %s %s\n\nCommands:\n", strings.TrimLeft(p.Intro, "\n"), p.Name, p.Usage)
	for _, c := range p.Commands {
		fmt.Fprintf(w, "  %-*s %s\n", width+1, c.Name, c.Summary)
	}
	fmt.Fprintf(w, "\nRun \"%s COMMAND --help\" for a command's flags and examples.\n\nExamples:\n%s\n%s",
		p.Name, strings.TrimLeft(p.Examples, "\n"), p.ExitCodes)
}

// runCommand parses a command's flags and runs it.
func (p *Program) runCommand(ctx context.Context, c *Command, args []string, stdout, stderr io.Writer) int {
	who := p.Name + " " + c.Name
	fs := flag.NewFlagSet(who, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, help goes to stdout
	fs.Usage = func() {}
	runner := c.Flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			p.commandUsage(stdout, c, fs)
			return ExitOK
		}
		return UsageError(stderr, who, err.Error())
	}
	if fs.NArg() > 0 && !c.Args {
		return UsageError(stderr, who, fmt.Sprintf("unexpected argument %q (every option is a --flag)", fs.Arg(0)))
	}
	return runner(ctx, fs.Args(), stdout, stderr)
}

func (p *Program) commandUsage(w io.Writer, c *Command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: %s %s %s\n\n", p.Name, c.Name, c.Synopsis)
	fmt.Fprint(w, strings.TrimLeft(c.About, "\n"))
	fmt.Fprint(w, "\nFlags:\n")
	for _, f := range visibleFlags(fs) {
		fmt.Fprintf(w, "  --%s", f.name)
		if f.arg != "" {
			fmt.Fprintf(w, " %s", f.arg)
		}
		usage := f.usage
		if f.def != "" {
			usage += " (default " + f.def + ")"
		}
		fmt.Fprintf(w, "\n%s", Wrap(usage, "      ", 78))
	}
	fmt.Fprintf(w, "  -h, --help\n      print this help and exit\n")
	if c.Examples != "" {
		fmt.Fprint(w, "\nExamples:\n")
		fmt.Fprint(w, strings.TrimLeft(c.Examples, "\n"))
	}
	exitCodes := p.ExitCodes
	if c.ExitCodes != "" {
		exitCodes = c.ExitCodes
	}
	fmt.Fprint(w, "\n"+exitCodes)
}

// Wrap fills text into lines of at most width columns, each starting with
// indent.
func Wrap(text, indent string, width int) string {
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

// UsageError reports a usage error of who ("vlink serve") and returns
// ExitUsage.
func UsageError(w io.Writer, who, msg string) int {
	fmt.Fprintf(w, "%s: %s\n", who, msg)
	fmt.Fprintf(w, "Run \"%s --help\" for usage.\n", who)
	return ExitUsage
}

// errUsage marks an error in the command line, as opposed to one met
// while running: Fail exits with ExitUsage for it.
type errUsage struct{ msg string }

func (e *errUsage) Error() string { return e.msg }

// Usagef returns a usage error.
func Usagef(format string, args ...any) error {
	return &errUsage{fmt.Sprintf(format, args...)}
}

// An ExitError makes Fail return Code having printed nothing: the command
// has said everything already (vlink-lab exec passes its program's status
// on).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Fail reports err as who's and returns the exit code it calls for:
// ExitOK for nil, ExitUsage for a usage error, an ExitError's code,
// ExitFailure for the rest.
func Fail(stderr io.Writer, who string, err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *errUsage
	if errors.As(err, &ue) {
		return UsageError(stderr, who, ue.msg)
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	fmt.Fprintf(stderr, "%s: %v\n", who, err)
	return ExitFailure
}

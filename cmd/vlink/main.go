// Command vlink is the single binary of the vlink project: it serves VLink
// stacks on a port and forwards what it accepts (serve), carries local TCP
// connections through a stack (tunnel), or standard input and output
// (connect, an ssh ProxyCommand), runs a SOCKS server whose connections
// follow stacks (socks), runs unmodified programs with their connections
// on stacks (exec), starts jobs of N processes that reach each other by
// rank (launch), runs a vlink network's rendezvous (relay), explains
// which way a destination takes (route), makes keys (key), measures every
// stack on loopback against raw TCP (bench), and lists what it knows
// (layers, version).
//
// Run "vlink --help" or "vlink COMMAND --help" for the usage; USAGE.txt
// beside this file holds all of it.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/secret"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// Exit codes, the same for every command (see cli).
const (
	exitOK      = cli.ExitOK      // success, including --help and a shutdown by signal
	exitFailure = cli.ExitFailure // a runtime failure: cannot listen, a benchmark failed
	exitUsage   = cli.ExitUsage   // a usage error: bad flag, missing or conflicting flags
)

func main() {
	// The standard logger is quic-go's alone, which uses it once to say
	// that the system keeps UDP socket buffers smaller than it wants (a
	// tuning hint, in ARCHITECTURE §14): not for the stderr of a program
	// run under vlink exec.
	log.SetOutput(io.Discard)
	program.Main()
}

// env is what a command runs with.
type env struct {
	stdin          io.Reader // os.Stdin; a command that reads it says so
	stdout, stderr io.Writer
	log            *slog.Logger
	level          slog.Level
	levelSet       bool     // --log-level was given
	logFormat      string   // --log-format: text or json
	args           []string // after the flags, for commands that take them
	// forwardsFile is the --forwards file the forward being set up comes
	// from (empty: the command line).
	forwardsFile string
}

var program = &cli.Program{
	Name: "vlink",
	Intro: `vlink carries TCP connections through stacks of layers (compression,
parallel streams, multiplexing; SSH, SOCKS and HTTP proxies to cross
firewalls), with a VLink peer mirroring the stack on the other side, and
runs unmodified programs on them.
`,
	Usage: "COMMAND [flags]",
	Examples: `  vlink bench --size 16M
  vlink layers
`,
	ExitCodes: `Exit codes:
  0  success (also --help, and a server stopped by SIGINT or SIGTERM)
  1  runtime failure
  2  usage error
`,
	Commands: []*cli.Command{serveCmd, tunnelCmd, connectCmd, socksCmd, relayCmd, execCmd, launchCmd, routeCmd, keyCmd, benchCmd, layersCmd, versionCmd},
	Aliases:  map[string]string{"-version": "version", "--version": "version"},
}

// withEnv gives a command the --log-level flag and runs it with its env.
func withEnv(flags func(fs *flag.FlagSet) func(context.Context, *env) int) func(*flag.FlagSet) cli.Runner {
	return withEnvAt(slog.LevelInfo, "", flags)
}

// withEnvAt is withEnv with another default level, and what the flag's
// help says about it (empty: nothing more).
func withEnvAt(def slog.Level, about string, flags func(fs *flag.FlagSet) func(context.Context, *env) int) func(*flag.FlagSet) cli.Runner {
	return func(fs *flag.FlagSet) cli.Runner {
		level := levelFlag{Level: def}
		fs.Var(&level, "log-level", "log at `LEVEL` and above: debug, info, warn or error"+about)
		format := "text"
		fs.Func("log-format", "write the log as `FORMAT`, text or json: key=value pairs (logfmt), or one JSON object per line for log collectors (default text)", func(v string) error {
			if v != "text" && v != "json" {
				return errors.New("want text or json")
			}
			format = v
			return nil
		})
		run := flags(fs)
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			log := newLogger(stderr, format, level.Level)
			return run(ctx, &env{logFormat: format, stdin: os.Stdin, stdout: stdout, stderr: stderr, log: log, level: level.Level, levelSet: level.set, args: args})
		}
	}
}

// newLogger logs to w at level and above, in format (text or json).
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Run(ctx, args, stdout, stderr)
}

var (
	usageError = cli.UsageError
	usagef     = cli.Usagef
)

// fail reports err and returns the exit code it calls for.
func fail(e *env, who string, err error) int { return cli.Fail(e.stderr, who, err) }

// levelFlag is a --log-level value.
type levelFlag struct {
	slog.Level
	set bool
}

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
	l.set = true
	return nil
}

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, " ") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// insecurePlaintextVar defines the dialing commands' opt-out of
// encryption.
func insecurePlaintextVar(fs *flag.FlagSet, p *bool) {
	fs.BoolVar(p, "insecure-plaintext", false, "UNSAFE: keep the stack as given; by default, with a key, a stack with layers sent beyond loopback gets the noise encryption layer at its bottom. Only for a network you trust")
}

// warnPassword warns when the stack a flag gives holds a password (a
// proxy URL's): other users of the machine read command lines in the
// process list, and shells keep them in their history.
func warnPassword(e *env, flag, stack string) {
	if e.forwardsFile != "" {
		return // no command line: loadForwards checks who can read the file
	}
	if shown := secret.RedactStack(stack); shown != stack {
		e.log.Warn(flag+" holds a password, which other users of this machine can read in the process list (and your shell keeps in its history): give the layer password-file=FILE (mode 600) or password-env=VAR instead",
			"stack", shown)
	}
}

// graceVar defines the servers' shutdown grace period flag.
func graceVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "grace", 5*time.Second,
		"on SIGINT or SIGTERM, stop accepting and give open connections this `DURATION` to finish before closing them")
}

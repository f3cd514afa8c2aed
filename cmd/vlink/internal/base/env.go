// Package base holds what vlink's commands share: the environment a
// command runs with (its output, log and arguments), the usage errors
// and exit codes, and the flags several commands define alike (the
// node flags, --known-nodes, --insecure-plaintext, --grace). It is
// cmd/vlink's own, as cmd/go/internal/base is the go command's.
package base

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Exit codes, the same for every command (see cli).
const (
	ExitOK      = cli.ExitOK      // success, including --help and a shutdown by signal
	ExitFailure = cli.ExitFailure // a runtime failure: cannot listen, a benchmark failed
	ExitUsage   = cli.ExitUsage   // a usage error: bad flag, missing or conflicting flags
)

// Env is what a command runs with.
type Env struct {
	Stdin          io.Reader // os.Stdin; a command that reads it says so
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	Level          slog.Level
	LevelSet       bool     // --log-level was given
	LogFormat      string   // --log-format: text or json
	Args           []string // after the flags, for commands that take them
	// ForwardsFile is the --forwards file the forward being set up comes
	// from (empty: the command line), and Forward its name there: its
	// name key, else its listen address.
	ForwardsFile, Forward string
}

// ForwardName is the forward's name in logs and metrics: its name in
// the --forwards file, else listen, its listen address as written.
func (e *Env) ForwardName(listen string) string {
	if e.Forward != "" {
		return e.Forward
	}
	return listen
}

// WithEnv gives a command the --log-level flag and runs it with its env.
func WithEnv(flags func(fs *flag.FlagSet) func(context.Context, *Env) int) func(*flag.FlagSet) cli.Runner {
	return WithEnvAt(slog.LevelInfo, "", flags)
}

// WithEnvAt is withEnv with another default level, and what the flag's
// help says about it (empty: nothing more).
func WithEnvAt(def slog.Level, about string, flags func(fs *flag.FlagSet) func(context.Context, *Env) int) func(*flag.FlagSet) cli.Runner {
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
			log := NewLogger(stderr, format, level.Level)
			return run(ctx, &Env{LogFormat: format, Stdin: os.Stdin, Stdout: stdout, Stderr: stderr, Log: log, Level: level.Level, LevelSet: level.set, Args: args})
		}
	}
}

// NewLogger logs to w at level and above, in format (text or json).
func NewLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var (
	UsageError = cli.UsageError
	Usagef     = cli.Usagef
)

// Fail reports err and returns the exit code it calls for.
func Fail(e *Env, who string, err error) int { return cli.Fail(e.Stderr, who, err) }

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

// ListFlag is a flag that may be given several times.
type ListFlag []string

func (l *ListFlag) String() string { return strings.Join(*l, " ") }

func (l *ListFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// InsecurePlaintextVar defines the dialing commands' opt-out of
// encryption.
func InsecurePlaintextVar(fs *flag.FlagSet, p *bool) {
	fs.BoolVar(p, "insecure-plaintext", false, "UNSAFE: keep the stack as given; by default, with a key, a stack with layers sent beyond loopback gets the noise encryption layer at its bottom. Only for a network you trust")
}

// WarnPassword warns when the stack a flag gives holds a password (a
// proxy URL's): other users of the machine read command lines in the
// process list, and shells keep them in their history.
func WarnPassword(e *Env, flag, stack string) {
	if e.ForwardsFile != "" {
		return // no command line: loadForwards checks who can read the file
	}
	if secret.HasPassword(stack) {
		e.Log.Warn(flag+" holds a password, which other users of this machine can read in the process list (and your shell keeps in its history): give the layer password-file=FILE (mode 600) or password-env=VAR instead",
			"stack", secret.RedactStack(stack))
	}
}

// GraceVar defines the servers' shutdown grace period flag.
func GraceVar(fs *flag.FlagSet, p *time.Duration) {
	fs.DurationVar(p, "grace", 5*time.Second,
		"on SIGINT or SIGTERM, stop accepting and give open connections this `DURATION` to finish before closing them")
}

// ParseLayerList reads a comma-separated list of the layers a dialer may
// ask for, given in flag.
func ParseLayerList(flag, list string) ([]string, error) {
	layers := []string{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		spec, ok := layer.Lookup(name)
		if !ok || !spec.Kind.Mirrored() {
			return nil, Usagef("%s: %q is not a layer a dialer can ask for (known: %s)", flag, name, strings.Join(mirroredNames(), ", "))
		}
		layers = append(layers, name)
	}
	return layers, nil
}

// CheckHostPort checks that s is HOST:PORT. Its errors quote s, but for
// one that holds what a URL's user-info would: a proxy URL given where a
// gateway's address goes shows none of it.
func CheckHostPort(s string) error {
	if strings.Contains(s, "@") || strings.Contains(s, "://") {
		return errors.New("holds an '@' or '://', as a URL does: want HOST:PORT (a proxy URL belongs in the stack)")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: want HOST:PORT: %v", s, err)
	}
	if host == "" || port == "" {
		return fmt.Errorf("%q: want HOST:PORT with both parts", s)
	}
	return nil
}

func mirroredNames() []string {
	var names []string
	for _, s := range layer.Specs() {
		if s.Kind == layer.KindFilter || s.Kind == layer.KindMultiLink {
			names = append(names, s.Name)
		}
	}
	return names
}

// FormatRate writes bits per second as people read them.
func FormatRate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f Mbit/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.1f kbit/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f bit/s", bps)
}

// CheckKeyCarried refuses a --key-file that the --stack given (s, parsed
// from stack) cannot carry: a stack with no layer for the peer to mirror
// and no gateway sends no hello, so the key would prove nothing, and a
// vlink serve with --key-file refuses the connection as a plain one. A
// node (node given) derives its node key from the network key, which
// --key-file may hold, so a node may give one with any stack.
func CheckKeyCarried(stack string, s vlink.Stack, via string, node *NodeOptions) error {
	if via != "" || !s.IsPlain() || node.Given() {
		return nil
	}
	shown := secret.RedactStack(stack)
	return Usagef("--key-file with --stack %s: that stack has no layer for the server to mirror, so it sends no hello and the key would prove nothing (a vlink serve with --key-file refuses such a connection): put a filter above it, e.g. --stack zstd+%s, or leave out --key-file", shown, shown)
}

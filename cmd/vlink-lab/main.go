// Command vlink-lab brings up the WAN lab of package internal/lab by
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
	"flag"
	"io"

	"github.com/vlink-dev/vlink/internal/cli"
)

// Exit codes (see cli): exec exits with its command's own status.
const (
	exitOK      = cli.ExitOK      // success, including --help and "up" stopped by a signal
	exitFailure = cli.ExitFailure // a runtime failure: cannot bring the lab up, a run failed
	exitUsage   = cli.ExitUsage   // a usage error: bad flag, missing argument
)

func main() { program.Main() }

type env struct {
	stdout, stderr io.Writer
}

var program = &cli.Program{
	Name: "vlink-lab",
	Intro: `vlink-lab emulates wide-area links between network namespaces on one Linux
machine: hosts joined by veth pairs, or by a user-space delay line that adds
a round-trip time, jitter and loss, with tbf rate limits and nftables
firewalls. It needs root.
`,
	Usage: "COMMAND [flags] [arguments]",
	Examples: `  vlink-lab up --detach wan50
  vlink-lab exec server iperf3 -s -D
  vlink-lab exec client iperf3 -c 10.77.0.2 -P 4
  vlink-lab down
`,
	ExitCodes: `Exit codes:
  0  success (also --help, and "up" stopped by SIGINT or SIGTERM)
  1  runtime failure
  2  usage error
  "exec" exits with the command's own status.
`,
	Commands: []*cli.Command{upCmd, execCmd, listCmd, downCmd, profilesCmd, ceilingCmd, benchCmd},
}

// withEnv runs a command, which returns an error, with its env, and
// turns the error into cli's exit code.
func withEnv(flags func(fs *flag.FlagSet) func(context.Context, *env, []string) error) func(*flag.FlagSet) cli.Runner {
	return func(fs *flag.FlagSet) cli.Runner {
		run := flags(fs)
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return cli.Fail(stderr, fs.Name(), run(ctx, &env{stdout: stdout, stderr: stderr}, args))
		}
	}
}

// run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Run(ctx, args, stdout, stderr)
}

var usagef = cli.Usagef

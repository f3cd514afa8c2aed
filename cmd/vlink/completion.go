package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
)

var completionCmd = &cli.Command{
	Name:      "completion",
	Summary:   "print a shell completion script (bash or zsh), made from the commands' flags",
	Synopsis:  "bash | zsh",
	ArgValues: []string{"bash", "zsh"},
	About: `
Prints a completion script for bash or zsh: commands, each command's
flags, the values of the flags that take a few (--log-level, --log-format,
--plain), and file names for the rest. It is made from the same command
table as --help, so it always matches this binary.
`,
	Examples: `
  # bash, for this shell:
  source <(vlink completion bash)
  # bash, for good:
  vlink completion bash > ~/.local/share/bash-completion/completions/vlink

  # zsh: a file named _vlink in a folder of $fpath
  vlink completion zsh > "${fpath[1]}/_vlink"
`,
	Args: true,
	Flags: base.WithEnv(func(fs *flag.FlagSet) func(context.Context, *base.Env) int {
		return func(ctx context.Context, e *base.Env) int {
			if len(e.Args) != 1 {
				return base.UsageError(e.Stderr, "vlink completion", "give the shell: bash or zsh")
			}
			switch e.Args[0] {
			case "bash":
				fmt.Fprint(e.Stdout, program.BashCompletion())
			case "zsh":
				fmt.Fprint(e.Stdout, program.ZshCompletion())
			default:
				return base.UsageError(e.Stderr, "vlink completion", fmt.Sprintf("%q: want bash or zsh", e.Args[0]))
			}
			return base.ExitOK
		}
	}),
}

var manCmd = &cli.Command{
	Name:     "man",
	Summary:  "print the manual page (roff), made from the help of every command",
	Synopsis: "[flags]",
	About: `
Prints vlink's manual page, section 1, in roff: the introduction and every
command's --help, as they print it. Install it where man finds it, or read
it at once with man -l.
`,
	Examples: `
  vlink man | man -l -
  vlink man > ~/.local/share/man/man1/vlink.1
`,
	Flags: base.WithEnv(func(fs *flag.FlagSet) func(context.Context, *base.Env) int {
		return func(ctx context.Context, e *base.Env) int {
			fmt.Fprint(e.Stdout, program.ManPage("1", manDate()))
			return base.ExitOK
		}
	}),
}

// The commands made from the command table itself join it here: their
// initializers refer to program, which cannot list them.
func init() { program.Commands = append(program.Commands, completionCmd, manCmd) }

// manDate dates the page by the build's commit time when the build
// recorded one, so the same binary prints the same page.
func manDate() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.time" {
				if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
					return t.Format("2006-01-02")
				}
			}
		}
	}
	return ""
}

package cli

import (
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func testProgram() *Program {
	run := func(err error) func(fs *flag.FlagSet) Runner {
		return func(fs *flag.FlagSet) Runner {
			n := fs.Int("n", 0, "how `MANY`")
			fs.Bool("secret", false, "(internal) not for --help")
			return func(_ context.Context, args []string, stdout, stderr io.Writer) int {
				io.WriteString(stdout, strings.Repeat("x", *n)+strings.Join(args, ","))
				return Fail(stderr, "prog cmd", err)
			}
		}
	}
	return &Program{
		Name:      "prog",
		Intro:     "prog does things.\n",
		Usage:     "COMMAND [flags]",
		Examples:  "  prog ok\n",
		ExitCodes: "Exit codes: 0 1 2\n",
		Commands: []*Command{
			{Name: "ok", Summary: "succeeds", Synopsis: "[--n N]", About: "Prints n x.\n", Flags: run(nil)},
			{Name: "args", Summary: "takes arguments", Flags: run(nil), Args: true},
			{Name: "usage", Summary: "fails with a usage error", Flags: run(Usagef("want %d", 3))},
			{Name: "exit", Summary: "passes a status on", Flags: run(&ExitError{Code: 7}), ExitCodes: "Exit codes: its program's\n"},
			{Name: "broken", Summary: "fails", Flags: run(errors.New("disk on fire"))},
		},
		Aliases: map[string]string{"--ok": "ok"},
	}
}

// TestRun checks what a user of a program sees: the exit code, stdout and
// stderr, for each kind of command line.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string // substrings; "" means empty
	}{
		{nil, ExitUsage, "", "prog: no command given"},
		{[]string{"--help"}, ExitOK, "  broken  fails\n", ""},
		{[]string{"help", "ok"}, ExitOK, "Usage: prog ok [--n N]", ""},
		{[]string{"help", "nope"}, ExitUsage, "", `unknown command "nope"`},
		{[]string{"nope"}, ExitUsage, "", "Run \"prog --help\" for usage."},
		{[]string{"--n", "3"}, ExitUsage, "", "flag --n given before a command"},
		{[]string{"ok", "--n", "3"}, ExitOK, "xxx", ""},
		{[]string{"--ok", "--n", "2"}, ExitOK, "xx", ""},
		{[]string{"ok", "--n", "x"}, ExitUsage, "", "prog ok: invalid value"},
		{[]string{"ok", "stray"}, ExitUsage, "", `unexpected argument "stray"`},
		{[]string{"args", "a", "b"}, ExitOK, "a,b", ""},
		{[]string{"usage"}, ExitUsage, "", "prog cmd: want 3\nRun \"prog cmd --help\""},
		{[]string{"exit"}, 7, "", ""},
		{[]string{"broken"}, ExitFailure, "", "prog cmd: disk on fire\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := testProgram().Run(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			for _, c := range []struct{ name, got, want string }{{"stdout", stdout.String(), tc.stdout}, {"stderr", stderr.String(), tc.stderr}} {
				if c.want == "" && c.got != "" || !strings.Contains(c.got, c.want) {
					t.Errorf("%s %q, want %q", c.name, c.got, c.want)
				}
			}
		})
	}
}

// TestCommandHelp checks a command's --help: flags sorted, internal ones
// hidden, defaults shown unless zero, examples and exit codes at the end.
func TestCommandHelp(t *testing.T) {
	var stdout strings.Builder
	if code := testProgram().Run(context.Background(), []string{"ok", "-h"}, &stdout, io.Discard); code != ExitOK {
		t.Fatalf("exit code %d", code)
	}
	want := "Usage: prog ok [--n N]\n\nPrints n x.\n\nFlags:\n  --n MANY\n      how MANY\n  -h, --help\n      print this help and exit\n\nExit codes: 0 1 2\n"
	if got := stdout.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// A command with exit codes of its own says them instead.
	stdout.Reset()
	testProgram().Run(context.Background(), []string{"exit", "-h"}, &stdout, io.Discard)
	if got := stdout.String(); !strings.HasSuffix(got, "\nExit codes: its program's\n") || strings.Contains(got, "0 1 2") {
		t.Errorf("exit -h ends:\n%s\nwant its own exit codes only", got)
	}
}

func TestWrap(t *testing.T) {
	got := Wrap("one two three four", "  ", 10)
	if want := "  one two\n  three\n  four\n"; got != want {
		t.Errorf("Wrap = %q, want %q", got, want)
	}
}

// TestGenerated checks the completion scripts and the man page made from
// the command table: every command and flag is there, the values of a
// flag that lists them, and roff's special characters escaped.
func TestGenerated(t *testing.T) {
	p := testProgram()
	p.Commands = append(p.Commands, &Command{Name: "lvl", Summary: "has choices", Flags: func(fs *flag.FlagSet) Runner {
		fs.String("level", "", "log at `LEVEL`: debug, info, warn or error")
		fs.String("path", "", `a \back.slash -path`)
		return nil
	}})
	bash := p.BashCompletion()
	for _, want := range []string{`compgen -W "ok args usage exit broken lvl help --help --version"`, `flags="--n --help"`,
		`--level) COMPREPLY=($(compgen -W "debug info warn error" -- "$cur"))`, "complete -o filenames -F _prog prog"} {
		if !strings.Contains(bash, want) {
			t.Errorf("bash completion lacks %q:\n%s", want, bash)
		}
	}
	if strings.Contains(bash, "--secret") {
		t.Errorf("bash completion offers an internal flag")
	}
	zsh := p.ZshCompletion()
	for _, want := range []string{"#compdef prog", "'ok:succeeds'", "'--n[how MANY]:many:_files'", "'--level[log at LEVEL]:level:(debug info warn error)'"} {
		if !strings.Contains(zsh, want) {
			t.Errorf("zsh completion lacks %q:\n%s", want, zsh)
		}
	}
	man := p.ManPage("1", "2026-11-25")
	for _, want := range []string{`.TH PROG 1 "2026-11-25" "prog" "prog manual"`, ".SH NAME\nprog \\- does things\n", ".SS prog ok\n.nf\nUsage: prog ok [\\-\\-n N]\n",
		`a \eback.slash \-path`} {
		if !strings.Contains(man, want) {
			t.Errorf("man page lacks %q:\n%s", want, man)
		}
	}
}

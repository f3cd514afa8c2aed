package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// TestBashCompletion sources the script in bash and completes as a user
// pressing tab would.
func TestBashCompletion(t *testing.T) {
	testenv.Programs(t, "bash")
	script := filepath.Join(t.TempDir(), "vlink.bash")
	code, out, _ := runSync("completion", "bash")
	if code != base.ExitOK {
		t.Fatalf("vlink completion bash: exit code %d", code)
	}
	os.WriteFile(script, []byte(out), 0o644)
	for _, tc := range []struct {
		words []string // the command line, the word being completed last
		want  string
	}{
		{[]string{"vlink", "tun"}, "tunnel"},
		{[]string{"vlink", "co"}, "connect completion"},
		{[]string{"vlink", "tunnel", "--sta"}, "--stack --stats"},
		{[]string{"vlink", "serve", "--log-level", "w"}, "warn"},
		{[]string{"vlink", "connect", "--log-format", ""}, "text json"},
		{[]string{"vlink", "help", "ser"}, "serve"},
	} {
		t.Run(strings.Join(tc.words, " "), func(t *testing.T) {
			cmd := exec.Command("bash", "-c", `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _vlink; echo "${COMPREPLY[*]}"`,
				"bash", script)
			cmd.Args = append(cmd.Args, tc.words...)
			got, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(got)) != tc.want {
				t.Errorf("completions %q, %v; want %q", strings.TrimSpace(string(got)), err, tc.want)
			}
		})
	}
}

// TestZshCompletion loads the script in zsh: it must parse, and define
// the completion function.
func TestZshCompletion(t *testing.T) {
	testenv.Programs(t, "zsh")
	dir := t.TempDir()
	code, out, _ := runSync("completion", "zsh")
	if code != base.ExitOK {
		t.Fatalf("vlink completion zsh: exit code %d", code)
	}
	os.WriteFile(filepath.Join(dir, "_vlink"), []byte(out), 0o644)
	cmd := exec.Command("zsh", "-f", "-c", `fpath=("$1" $fpath); autoload -Uz compinit && compinit -u -D && autoload -Uz _vlink && whence -w _vlink && zsh -n "$1/_vlink"`, "zsh", dir)
	got, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(got), "_vlink: function") {
		t.Errorf("zsh: %v: %s", err, got)
	}
}

// TestManPage renders the page with groff, warnings on: it must render
// without one and hold every command.
func TestManPage(t *testing.T) {
	testenv.Programs(t, "groff")
	code, page, _ := runSync("man")
	if code != base.ExitOK || !strings.HasPrefix(page, ".TH VLINK 1 ") {
		t.Fatalf("vlink man: exit code %d, page starts %q", code, page[:min(len(page), 40)])
	}
	cmd := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z")
	cmd.Stdin = strings.NewReader(page)
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("groff: %v: %s", err, out)
	}
	cmd = exec.Command("groff", "-man", "-Tascii")
	cmd.Stdin = strings.NewReader(page)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	for _, c := range program.Commands {
		if !strings.Contains(text, "Usage: vlink "+c.Name) {
			t.Errorf("the rendered page has no usage of %s", c.Name)
		}
	}
	if !strings.Contains(text, "--stack STACK") {
		t.Errorf("the rendered page lost the flags' dashes:\n%s", text[:2000])
	}
}

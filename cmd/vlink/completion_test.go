package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
		{[]string{"vlink", "completion", ""}, "bash zsh"},
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

// zshScript writes vlink's zsh completion script as _vlink in a folder
// of its own, which it returns, for zsh's fpath.
func zshScript(t *testing.T) string {
	t.Helper()
	testenv.Programs(t, "zsh")
	dir := t.TempDir()
	code, out, _ := runSync("completion", "zsh")
	if code != base.ExitOK {
		t.Fatalf("vlink completion zsh: exit code %d", code)
	}
	if err := os.WriteFile(filepath.Join(dir, "_vlink"), []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestZshCompletion loads the script in zsh: it must parse, and define
// the completion function.
func TestZshCompletion(t *testing.T) {
	dir := zshScript(t)
	cmd := exec.Command("zsh", "-f", "-c", `fpath=("$1" $fpath); autoload -Uz compinit && compinit -u -D && autoload -Uz _vlink && whence -w _vlink && zsh -n "$1/_vlink"`, "zsh", dir)
	got, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(got), "_vlink: function") {
		t.Errorf("zsh: %v: %s", err, got)
	}
}

// zshTab is a zsh script that types its second argument into an
// interactive zsh on a pseudo-terminal (zpty), its completion system
// loaded from the folder of its first, presses tab, and prints what the
// completion offered as HITS<...> (written so that the terminal's echo
// of the line defining it does not match): zsh completing as a user
// would.
const zshTab = `
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT='' ; fpath=($1 \$fpath); autoload -Uz compinit; compinit -u -D; echo READY"
zpty -r z out '*READY*'
zpty -w z 'compadd() { local -a __hits; builtin compadd -O __hits "$@"; (( $#__hits )) && print -r -- "HI""TS<${(j: :)__hits}>"; builtin compadd "$@" }'
zpty -w -n z "$2"$'\t'
all=""
for i in {1..100}; do
	while zpty -r -t z chunk 2>/dev/null; do all+=$chunk; done
	[[ $all == *HITS\<*\>* || $all == *"command not found"* ]] && break
	sleep 0.1
done
print -r -- "$all"
zpty -d z
`

// TestZshCompletionTab completes in a real zsh, as a user pressing tab:
// commands' flags and their values, a flag whose argument is HOST:PORT
// (a bare colon there made zsh run "port"), and completion's own
// argument.
func TestZshCompletionTab(t *testing.T) {
	dir := zshScript(t)
	for _, tc := range []struct{ line, want string }{
		{"vlink tunnel --sta", "--stack --stats"},
		{"vlink serve --log-level ", "debug info warn error"},
		{"vlink completion ", "bash zsh"},
		{"vlink serve --relay ", ""}, // file names: anything but an error
	} {
		t.Run(tc.line, func(t *testing.T) {
			cmd := exec.Command("zsh", "-f", "-c", zshTab, "zsh", dir, tc.line)
			cmd.Dir = dir // the file names offered: _vlink's folder's
			got, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("zsh: %v: %s", err, got)
			}
			m := regexp.MustCompile(`HITS<([^>]*)>`).FindSubmatch(got)
			switch {
			case bytes.Contains(got, []byte("command not found")):
				t.Errorf("zsh ran a word of the spec as a command:\n%q", got)
			case m == nil:
				t.Errorf("nothing offered:\n%q", got)
			case tc.want != "" && string(m[1]) != tc.want:
				t.Errorf("offered %q, want %q", m[1], tc.want)
			case tc.want == "" && string(m[1]) != "_vlink":
				t.Errorf("offered %q, want the folder's file _vlink", m[1])
			}
		})
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
	plain := regexp.MustCompile(`.\x08`).ReplaceAllString(text, "") // groff's overstrike, for bold
	for _, want := range []string{"EXIT STATUS", "2  usage error", "ENVIRONMENT", "VLINK_CONFIG", "FILES", "known_nodes"} {
		if !strings.Contains(plain, want) {
			t.Errorf("the rendered page has no %q", want)
		}
	}
	if !strings.Contains(text, "--stack STACK") {
		t.Errorf("the rendered page lost the flags' dashes:\n%s", text[:2000])
	}
}

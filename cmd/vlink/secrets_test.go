package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
)

// secretPieces are the distinctive pieces of the user name and passwords
// the tests below write: no message may hold any of them.
var secretPieces = []string{"Al1ce", "S3cret", "Qu1x", "Zy9", "Wv8", "Kp7"}

func leaked(s string) []string {
	var out []string
	for _, p := range secretPieces {
		if strings.Contains(strings.ToLower(s), strings.ToLower(p)) {
			out = append(out, p)
		}
	}
	return out
}

// TestSecretsStayOutOfMessages runs the commands with a secret in each
// place a stack or a proxy URL is given (--stack, VLINK_STACK, a
// --forwards file, a config file), written well or badly, and checks
// that what they print says what is wrong and shows no part of it.
func TestSecretsStayOutOfMessages(t *testing.T) {
	const broken = "socks5://Al1ce:S3cret/Qu1x#Zy9?Wv8+Kp7@proxy.example:1080"
	const forward = "[[forward]]\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:1\"\n"
	for _, tc := range []struct {
		name string
		env  map[string]string
		file string // written to FILE, which args and env may name
		args []string
		want []string // in stderr
		not  []string // not in stderr, beyond the secret's pieces
	}{
		{name: "VLINK_STACK with a misplaced password", env: map[string]string{"VLINK_STACK": "zstd:password=S3cret"},
			args: []string{"connect", "127.0.0.1:1"}, want: []string{"VLINK_STACK", `unknown parameter "password"`}},
		{name: "VLINK_STACK with a broken URL", env: map[string]string{"VLINK_STACK": broken},
			args: []string{"connect", "127.0.0.1:1"}, want: []string{"VLINK_STACK", "percent-encode"}},
		{name: "--stack with a broken URL", args: []string{"connect", "--stack", broken, "127.0.0.1:1"},
			want: []string{"--stack", "layer 1 (socks5)", "percent-encode"}},
		{name: "--stack with a comma in a password", args: []string{"connect", "--stack", "socks5:addr=p:1,password=S3cret,Qu1x", "127.0.0.1:1"},
			want: []string{"--stack", "password", "%2C"}},
		{name: "--stack with a misspelled password", args: []string{"connect", "--stack", "socks5:addr=p:1,pasword=S3cret", "127.0.0.1:1"},
			want: []string{"--stack", `unknown parameter "pasword"`}},
		{name: "--stack with pw", args: []string{"tunnel", "--stack", "socks5:addr=p:1,pw=S3cret", "--to", "127.0.0.1:1"},
			want: []string{"--stack", `unknown parameter "pw"`}},
		{name: "--via with a proxy URL", args: []string{"connect", "--stack", "zstd", "--via", "socks5://Al1ce:S3cret@proxy.example:1080", "127.0.0.1:1"},
			want: []string{"--via", "HOST:PORT"}},
		{name: "forwards file with a broken URL", file: forward + "stack = \"" + broken + "\"\n",
			args: []string{"tunnel", "--forwards", "FILE"}, want: []string{"forward 1", "percent-encode"}},
		{name: "forwards file with a misspelled key", file: forward + "stack = \"tcp\"\npasword = \"S3cret\"\n",
			args: []string{"tunnel", "--forwards", "FILE"}, want: []string{"forward 1", `unknown key "pasword"`}},
		{name: "forwards file with an unknown table", file: "[[forwrd]]\nlisten = \"127.0.0.1:0\"\nstack = \"socks5://Al1ce:S3cret@p:1\"\n",
			args: []string{"tunnel", "--forwards", "FILE"}, want: []string{"FILE:1", "forwrd"}},
		{name: "forwards file with a table for a stack", file: forward + "stack = {password = \"S3cret\"}\n",
			args: []string{"tunnel", "--forwards", "FILE"}, want: []string{"forward 1", "stack", "want a string"}},
		{name: "forwards file with a bad escape", file: forward + "stack = \"socks5://Al1ce:S3cret\\Qu1x@p:1\"\n",
			args: []string{"tunnel", "--forwards", "FILE"}, want: []string{"FILE:4:"}, not: []string{"'Q'", "U+0051"}},
		{name: "config file with an unknown key", env: map[string]string{"VLINK_CONFIG": "FILE"},
			file: "[[route]]\nhost = \"x\"\nstak = \"socks5://Al1ce:S3cret@p:1\"\n",
			args: []string{"tunnel", "--to", "127.0.0.1:1"}, want: []string{"FILE:3", `unknown key "route.stak"`}},
		{name: "config file with a broken URL", file: "[default]\nstack = \"" + broken + "\"\n",
			args: []string{"socks", "--config", "FILE"}, want: []string{"default route", "percent-encode"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("XDG_CONFIG_HOME", t.TempDir())
			t.Setenv("VLINK_CONFIG", "")
			os.Unsetenv("VLINK_CONFIG")
			t.Setenv("VLINK_STACK", "")
			file := filepath.Join(t.TempDir(), "file.toml")
			if tc.file != "" {
				if err := os.WriteFile(file, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, strings.ReplaceAll(v, "FILE", file))
			}
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "FILE", file)
			}
			code, _, stderr := runSync(args...)
			if code == base.ExitOK {
				t.Fatalf("exit code 0; stderr:\n%s", stderr)
			}
			if leaked(stderr) != nil {
				t.Errorf("stderr shows %q:\n%s", leaked(stderr), stderr)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "FILE", file); !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(stderr, n) {
					t.Errorf("stderr says %q:\n%s", n, stderr)
				}
			}
		})
	}
}

// TestSecretsStayOutOfLogs: a tunnel whose proxy URL holds a user and a
// password logs that it does, and where it listens, without either.
func TestSecretsStayOutOfLogs(t *testing.T) {
	r := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", "127.0.0.1:1", "--stack", "socks5://Al1ce:S3cret@127.0.0.1:1")
	r.addr(t)
	r.stop(t)
	log := r.stderr.String()
	if leaked(log) != nil {
		t.Errorf("the log shows %q:\n%s", leaked(log), log)
	}
	for _, w := range []string{"--stack holds a password", "socks5://REDACTED@127.0.0.1:1"} {
		if !strings.Contains(log, w) {
			t.Errorf("the log does not say %q:\n%s", w, log)
		}
	}
}

package secret

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPassword(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "s3cret pass\n", 0o600)
	crlf := write("crlf", "pw\r\n", 0o600)
	open := write("open", "pw\n", 0o644)
	empty := write("empty", "\n", 0o600)
	big := write("big", strings.Repeat("x", MaxLen+1), 0o600)
	t.Setenv("SECRET_TEST_PW", "from-env")
	t.Setenv("SECRET_TEST_EMPTY", "")

	for _, tc := range []struct {
		name, inline string
		file, env    string
		want         string
		wantErr      string
		is           error
	}{
		{name: "none"},
		{name: "file", file: good, want: "s3cret pass"},
		{name: "crlf", file: crlf, want: "pw"},
		{name: "env", env: "SECRET_TEST_PW", want: "from-env"},
		{name: "both", file: good, env: "SECRET_TEST_PW", wantErr: "give one of"},
		{name: "inline", inline: "from a URL", want: "from a URL"},
		{name: "inline and file", inline: "x", file: good, wantErr: "give one of"},
		{name: "readable by others", file: open, wantErr: "chmod 600", is: ErrReadableByOthers},
		{name: "empty file", file: empty, is: ErrNoPassword},
		{name: "too big", file: big, wantErr: "more than a password"},
		{name: "missing file", file: filepath.Join(dir, "nope"), is: os.ErrNotExist},
		{name: "unset env", env: "SECRET_TEST_UNSET_XYZ", is: ErrNoPassword},
		{name: "empty env", env: "SECRET_TEST_EMPTY", is: ErrNoPassword},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Password(tc.inline, tc.file, tc.env)
			switch {
			case tc.wantErr == "" && tc.is == nil:
				if err != nil || got != tc.want {
					t.Fatalf("Password = %q, %v; want %q", got, err, tc.want)
				}
			case err == nil:
				t.Fatalf("Password = %q, want an error", got)
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Fatalf("error %v does not match %v", err, tc.is)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q does not say %q", err, tc.wantErr)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		mode os.FileMode
		is   error
	}{
		{"owner only", 0o600, nil},
		{"read-only", 0o400, nil},
		{"group", 0o640, ErrReadableByOthers},
		{"others", 0o604, ErrReadableByOthers},
		{"group write", 0o620, ErrReadableByOthers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, []byte("  s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tc.mode); err != nil {
				t.Fatal(err)
			}
			got, err := ReadFile(p, "key file")
			if tc.is == nil {
				if err != nil || string(got) != "s3cret" {
					t.Fatalf("ReadFile = %q, %v; want \"s3cret\"", got, err)
				}
				return
			}
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), "key file "+p) || !strings.Contains(err.Error(), "chmod 600") {
				t.Fatalf("ReadFile = %v, want %v naming the file and the fix", err, tc.is)
			}
		})
	}
	if _, err := ReadFile(filepath.Join(dir, "nope"), "key file"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestName(t *testing.T) {
	for name, want := range map[string]bool{
		"password": true, "passwd": true, "Password": true, "pass": true, "secret": true, "token": true,
		"psk": true, "key": true, "private-key": true, "api_key": true, "credentials": true,
		"pw": true, "pwd": true, "pasword": true, "paswd": true, "db-pw": true, "auth-token": true,
		"password-file": false, "password-env": false, "host-key-check": false, "known-hosts": false,
		"identity": false, "user": false, "host": false, "keepalive": false, "streams": false,
	} {
		t.Run(name, func(t *testing.T) {
			if got := Name(name); got != want {
				t.Errorf("Name(%q) = %t, want %t", name, got, want)
			}
		})
	}
}

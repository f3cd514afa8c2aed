package vlink

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadIdentityFile(t *testing.T) {
	id := NewIdentity()
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
		mention string // "" for success
	}{
		{"made by vlink key", base64.StdEncoding.EncodeToString(id) + "\n", 0o600, ""},
		{"readable by others", base64.StdEncoding.EncodeToString(id), 0o644, "chmod 600"},
		{"not base64", "not a key at all", 0o600, "vlink key --identity"},
		{"short", base64.StdEncoding.EncodeToString(id[:16]), 0o600, "32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(path, tc.mode)
			got, err := ReadIdentityFile(path)
			switch {
			case tc.mention == "" && (err != nil || string(got) != string(id)):
				t.Fatalf("ReadIdentityFile = %x, %v; want the identity", got, err)
			case tc.mention != "" && (err == nil || !strings.Contains(err.Error(), tc.mention)):
				t.Fatalf("ReadIdentityFile: %v, want an error mentioning %q", err, tc.mention)
			}
		})
	}
	if err := (&Policy{Identity: id[:31]}).Validate(); err == nil {
		t.Error("a policy with a 31-byte identity is valid")
	}
}

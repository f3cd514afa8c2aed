package base

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// ReadRulesFile takes [[allow]] tables and says, with the file and line,
// what is wrong with any other.
func TestReadRulesFile(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, text string
		rules      int
		is         error  // with mention, what the error matches
		mention    string // "" for success
	}{
		{"two rules", "[[allow]]\nfrom = \"group:ops\"\nto = \"db\"\nports = \"5432\"\n\n[[allow]]\nfrom = \"*\"\nto = \"web\"\nports = \"80-443\"\n", 2, nil, ""},
		{"none", "", 0, nil, ""},
		{"misspelt key", "[[allow]]\nfrom = \"a\"\nto = \"b\"\nport = \"1\"\n", 0, nil, `:4: unknown key "allow.port"`},
		{"no ports", "[[allow]]\nfrom = \"a\"\nto = \"b\"\n", 0, nodecert.ErrInvalidRule, "ports"},
		{"bad group", "[[allow]]\nfrom = \"group:Ops\"\nto = \"b\"\nports = \"*\"\n", 0, nodecert.ErrInvalidRule, "Ops"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".toml")
			if err := os.WriteFile(path, []byte(tt.text), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := ReadRulesFile(path)
			switch {
			case tt.mention == "" && (err != nil || r.Len() != tt.rules):
				t.Fatalf("ReadRulesFile = %d rules, %v; want %d", r.Len(), err, tt.rules)
			case tt.mention != "" && (err == nil || !strings.Contains(err.Error(), tt.mention) || tt.is != nil && !errors.Is(err, tt.is)):
				t.Fatalf("ReadRulesFile: %v; want an error mentioning %q (matching %v)", err, tt.mention, tt.is)
			}
		})
	}
}

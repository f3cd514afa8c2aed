// Package clitest checks what package cli's programs print, for their
// tests.
package clitest

import (
	"flag"
	"os"
	"testing"

	"github.com/vlink-dev/vlink/internal/cli"
)

var update = flag.Bool("update", false, "rewrite USAGE.txt from the commands' --help")

// UsageFile checks that USAGE.txt, in the test's folder, is p's whole
// help (see Program.Help); with -update it rewrites the file first.
func UsageFile(t *testing.T, p *cli.Program) {
	t.Helper()
	want := p.Help()
	if *update {
		if err := os.WriteFile("USAGE.txt", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("USAGE.txt")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("USAGE.txt is out of date; run go test -run TestUsageFile -update in %s", wd())
	}
}

func wd() string {
	d, err := os.Getwd()
	if err != nil {
		return "the command's folder"
	}
	return d
}

package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestEnvironmentMatchesReference: the man page's ENVIRONMENT (the
// program's Environment) names the VLINK_ variables docs/REFERENCE.md's
// tables do, no more and no fewer, so the two cannot drift apart. The
// variables only the tests read are REFERENCE's alone.
func TestEnvironmentMatchesReference(t *testing.T) {
	ref, err := os.ReadFile("../../docs/REFERENCE.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(ref)
	start := strings.Index(text, "\n## Environment variables\n")
	end := strings.Index(text[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/REFERENCE.md has no Environment variables section")
	}
	name := regexp.MustCompile("VLINK_[A-Z_]+")
	var inRef []string
	for line := range strings.Lines(text[start : start+1+end]) {
		if strings.HasPrefix(line, "| `") { // a table row: its first column
			first, _, _ := strings.Cut(line[1:], "|")
			inRef = append(inRef, name.FindAllString(first, -1)...)
		}
	}
	var inMan []string
	for _, e := range program.Environment {
		inMan = append(inMan, name.FindAllString(e.Name, -1)...)
	}
	slices.Sort(inRef)
	slices.Sort(inMan)
	inRef, inMan = slices.Compact(inRef), slices.Compact(inMan)
	for _, v := range inRef {
		if !slices.Contains(inMan, v) {
			t.Errorf("%s is in docs/REFERENCE.md's tables and not in the man page's ENVIRONMENT (main.go's Environment)", v)
		}
	}
	for _, v := range inMan {
		if !slices.Contains(inRef, v) {
			t.Errorf("%s is in the man page's ENVIRONMENT and not in docs/REFERENCE.md's tables", v)
		}
	}
	if len(inRef) < 20 {
		t.Errorf("found %d variables in docs/REFERENCE.md's tables: %v; the parse lost some", len(inRef), inRef)
	}
}

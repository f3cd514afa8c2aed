// Command summary reads `go test -json` output and tells a person what
// happened: how many tests passed, failed and were skipped, the skips
// grouped by the reason they gave (what the test needs and how to get
// it), and the whole output of every failed test. It exits 1 if any test
// or package failed, so a script can use it as the verdict:
//
//	go test -json ./... | go run ./internal/testenv/summary
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// event is one line of test2json's output (go doc test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // of a build-output event
	FailedBuild string // of a package that did not build
}

type key struct{ pkg, test string }

// A report is what the events said.
type report struct {
	passed, skipped, failed int
	packages                map[string]string // package -> its final action
	output                  map[key][]string
	reasons                 map[string]int // skip reason -> tests
	failures                []key
}

// logLine is a t.Log or t.Skip line: "    file_test.go:12: text".
var logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)

func read(r io.Reader) (*report, error) {
	rep := &report{packages: map[string]string{}, output: map[key][]string{}, reasons: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			continue // go test's own lines (build errors) go to stderr, not here
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "build-output":
			k = key{e.ImportPath, ""}
			rep.output[k] = append(rep.output[k], e.Output)
		case "output":
			rep.output[k] = append(rep.output[k], e.Output)
		case "pass", "fail", "skip":
			if e.Test == "" {
				rep.packages[e.Package] = e.Action
				if e.FailedBuild != "" {
					rep.failures = append(rep.failures, key{e.FailedBuild, ""})
				} else if e.Action == "fail" {
					rep.failures = append(rep.failures, k)
				}
				continue
			}
			switch e.Action {
			case "pass":
				rep.passed++
			case "fail":
				rep.failed++
				rep.failures = append(rep.failures, k)
			case "skip":
				rep.skipped++
				rep.reasons[skipReason(rep.output[k])]++
			}
		}
	}
	return rep, sc.Err()
}

// skipReason is the last logged line of a skipped test: what t.Skip said.
func skipReason(out []string) string {
	for i := len(out) - 1; i >= 0; i-- {
		if m := logLine.FindStringSubmatch(strings.TrimRight(out[i], "\n")); m != nil {
			return strings.TrimPrefix(m[1], "skipping: ")
		}
	}
	return "(no reason given)"
}

func (rep *report) write(w io.Writer, title string) {
	failedPkgs := 0
	for _, a := range rep.packages {
		if a == "fail" {
			failedPkgs++
		}
	}
	fmt.Fprintf(w, "%s: %d passed, %d skipped, %d failed, in %d packages (%d failed)\n",
		title, rep.passed, rep.skipped, rep.failed, len(rep.packages), failedPkgs)
	if len(rep.reasons) > 0 {
		type row struct {
			reason string
			n      int
		}
		var rows []row
		for r, n := range rep.reasons {
			rows = append(rows, row{r, n})
		}
		slices.SortFunc(rows, func(a, b row) int {
			return cmp.Or(b.n-a.n, strings.Compare(a.reason, b.reason))
		})
		fmt.Fprintln(w, "skipped, by reason:")
		for _, r := range rows {
			fmt.Fprintf(w, "%5d  %s\n", r.n, r.reason)
		}
	}
	testFailed := map[string]bool{}
	for _, k := range rep.failures {
		if k.test != "" {
			testFailed[k.pkg] = true
		}
	}
	for _, k := range rep.failures {
		if k.test == "" && testFailed[k.pkg] {
			continue // its tests' output says why
		}
		name := k.pkg
		if k.test != "" {
			name += " " + k.test
		}
		fmt.Fprintf(w, "\n--- FAIL: %s\n%s", name, strings.Join(rep.output[k], ""))
	}
}

func (rep *report) ok() bool {
	if rep.failed > 0 {
		return false
	}
	for _, a := range rep.packages {
		if a == "fail" {
			return false
		}
	}
	return true
}

func main() {
	title := flag.String("title", "go test", "the first words of the summary line")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go test -json ./... | go run ./internal/testenv/summary [-title TEXT]\n\n"+
			"Counts the tests that passed, failed and were skipped, groups the skips by\n"+
			"their reason, and prints every failed test's output. Exits 1 if any failed.\n")
	}
	flag.Parse()
	rep, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary: reading go test -json output:", err)
		os.Exit(1)
	}
	rep.write(os.Stdout, *title)
	if !rep.ok() {
		os.Exit(1)
	}
}

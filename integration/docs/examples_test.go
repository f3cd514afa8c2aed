package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// exampleDocs are the documents whose shell examples run, in the order a
// reader meets them: the guide's take up where the README's end.
var exampleDocs = []string{"README.md", "docs/GUIDE.md"}

// An example is one shell block of a document, with what the comment
// before it says: run it (and what its standard output must hold), or
// skip it, and why.
type example struct {
	doc    string // the document, relative to the checkout's root
	line   int    // the line of the block's opening fence
	run    bool
	reason string   // why it does not run
	expect []string // what its standard output must hold
	text   string   // the block's lines
}

func (e example) String() string { return fmt.Sprintf("%s:%d", e.doc, e.line) }

var (
	markerRE = regexp.MustCompile(`^<!-- test: (run|skip)(.*?)\s*-->$`)
	expectRE = regexp.MustCompile(`^,\s*expect\s+("(?:[^"\\]|\\.)*")\s*`)
	shellRE  = regexp.MustCompile("^```(sh|bash|shell|console)\\s*$")
)

// parseExamples reads doc's shell blocks. Every one must come right after
// its marker, a comment the reader does not see:
//
//	<!-- test: run -->
//	<!-- test: run, expect "TEXT", expect "MORE" -->
//	<!-- test: skip, REASON -->
//
// so that a new example is either run or skipped for a reason someone
// wrote down, never forgotten.
func parseExamples(doc, text string) ([]example, error) {
	var (
		out     []example
		pending *example
		lines   = strings.Split(text, "\n")
	)
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if m := markerRE.FindStringSubmatch(line); m != nil {
			if pending != nil {
				return nil, fmt.Errorf("%s: a test marker not followed by its shell block", pending)
			}
			e, err := parseMarker(doc, i+2, m[1], m[2])
			if err != nil {
				return nil, err
			}
			pending = &e
			continue
		}
		if strings.HasPrefix(line, "```") {
			start := i
			var body []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
				body = append(body, lines[i])
			}
			if !shellRE.MatchString(line) {
				if pending != nil {
					return nil, fmt.Errorf("%s: a test marker before a block that is not a shell block (%s)", pending, line)
				}
				continue
			}
			if pending == nil {
				return nil, fmt.Errorf("%s:%d: a shell block without a marker before it (<!-- test: run --> or <!-- test: skip, REASON -->)", doc, start+1)
			}
			if pending.line != start+1 {
				return nil, fmt.Errorf("%s: the marker must be the line right before its block, at line %d", pending, start+1)
			}
			pending.text = strings.Join(body, "\n") + "\n"
			out = append(out, *pending)
			pending = nil
			continue
		}
		if pending != nil && line != "" {
			return nil, fmt.Errorf("%s: a test marker not followed by its shell block", pending)
		}
	}
	if pending != nil {
		return nil, fmt.Errorf("%s: a test marker not followed by its shell block", pending)
	}
	return out, nil
}

// parseMarker reads what follows "<!-- test: run" or "skip" in a marker.
func parseMarker(doc string, line int, verb, rest string) (example, error) {
	e := example{doc: doc, line: line, run: verb == "run"}
	if !e.run {
		e.reason = strings.TrimSpace(strings.TrimPrefix(rest, ","))
		if !strings.HasPrefix(rest, ",") || e.reason == "" {
			return e, fmt.Errorf("%s: a skipped example says why: <!-- test: skip, REASON -->", e)
		}
		return e, nil
	}
	for rest != "" {
		m := expectRE.FindStringSubmatch(rest)
		if m == nil {
			return e, fmt.Errorf("%s: after \"test: run\", want `, expect \"TEXT\"`, not %q", e, rest)
		}
		s, err := strconv.Unquote(m[1])
		if err != nil {
			return e, fmt.Errorf("%s: expect %s: %v", e, m[1], err)
		}
		e.expect = append(e.expect, s)
		rest = rest[len(m[0]):]
	}
	return e, nil
}

// readExamples parses every document of exampleDocs.
func readExamples(tb testing.TB, root string) []example {
	tb.Helper()
	var all []example
	for _, doc := range exampleDocs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			tb.Fatal(err)
		}
		ex, err := parseExamples(doc, string(b))
		if err != nil {
			tb.Fatal(err)
		}
		all = append(all, ex...)
	}
	return all
}

// TestExamplesMarked checks, on any machine, that every shell block of
// the README and the guide says whether it runs, and that the README
// keeps its commands: the two that .ci/bare runs, the install line of
// .ci/run, and three examples that run.
func TestExamplesMarked(t *testing.T) {
	root := moduleRoot(t)
	all := readExamples(t, root)
	runs := map[string]int{}
	var readme strings.Builder
	for _, e := range all {
		if e.run {
			runs[e.doc]++
		}
		if e.doc == "README.md" {
			readme.WriteString(e.text)
		}
	}
	if runs["README.md"] < 4 {
		t.Errorf("README.md has %d examples that run, want the install and three examples", runs["README.md"])
	}
	for _, cmd := range []string{"go run ./cmd/vlink bench", "go test ./...", "go install ./cmd/vlink"} {
		if !strings.Contains(readme.String(), cmd) {
			t.Errorf("README.md's shell blocks no longer say %q, which .ci/run and .ci/bare run as the README's", cmd)
		}
	}
}

func TestParseExamples(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []example // text left out
		err       string
	}{
		{"run", "<!-- test: run -->\n```sh\necho\n```\n", []example{{line: 2, run: true}}, ""},
		{"expect", "<!-- test: run, expect \"a \\\"b\\\"\", expect \"c\" -->\n```sh\necho\n```\n",
			[]example{{line: 2, run: true, expect: []string{`a "b"`, "c"}}}, ""},
		{"skip", "<!-- test: skip, needs a bastion -->\n```bash\nssh\n```\n", []example{{line: 2, reason: "needs a bastion"}}, ""},
		{"other blocks", "```go\nx\n```\n```\nout\n```\n", nil, ""},
		{"unmarked", "text\n\n```sh\necho\n```\n", nil, "x.md:3: a shell block without a marker"},
		{"skip without reason", "<!-- test: skip -->\n```sh\necho\n```\n", nil, "says why"},
		{"marker apart", "<!-- test: run -->\n\n```sh\necho\n```\n", nil, "right before its block"},
		{"marker before text", "<!-- test: run -->\ntext\n", nil, "not followed by its shell block"},
		{"marker before go", "<!-- test: run -->\n```go\nx\n```\n", nil, "not a shell block"},
		{"bad option", "<!-- test: run, expext \"a\" -->\n```sh\necho\n```\n", nil, "want `, expect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseExamples("x.md", tc.doc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d examples, want %d: %+v", len(got), len(tc.want), got)
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.line != w.line || g.run != w.run || g.reason != w.reason || strings.Join(g.expect, "|") != strings.Join(w.expect, "|") {
					t.Errorf("example %d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

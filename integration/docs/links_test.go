package docs

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// moduleRoot is the checkout's root, two folders up from this package.
func moduleRoot(tb testing.TB) string {
	tb.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		tb.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// markdownFiles lists the Markdown files of the checkout, relative to
// root, leaving out hidden folders (.git).
func markdownFiles(tb testing.TB, root string) []string {
	tb.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

var (
	fenceRE    = regexp.MustCompile("^\\s*(```|~~~)")
	headingRE  = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	codeSpanRE = regexp.MustCompile("`+[^`]*`+")
	linkRE     = regexp.MustCompile(`!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	htmlIDRE   = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// slug is the anchor GitHub gives a heading: its text as rendered, in
// lower case, without punctuation, spaces turned into hyphens.
func slug(heading string) string {
	text := linkRE.ReplaceAllString(heading, "$1")
	text = strings.ReplaceAll(text, "`", "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), unicode.Is(unicode.Mn, r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// mdDoc is what the link check reads in one Markdown file: its anchors,
// and its links with their line numbers.
type mdDoc struct {
	anchors map[string]bool
	links   []mdLink
}

type mdLink struct {
	line   int
	target string
}

// parseMarkdown reads the headings' anchors (numbered -1, -2... when a
// heading repeats, as GitHub does) and the links outside code.
func parseMarkdown(text string) mdDoc {
	d := mdDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[1]
			case fence == m[1]:
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			s := slug(m[1])
			if n := seen[s]; n > 0 {
				d.anchors[s+"-"+strconv.Itoa(n)] = true
			} else {
				d.anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
			d.links = append(d.links, mdLink{line: i + 1, target: m[2]})
		}
	}
	return d
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"The WAN lab", "the-wan-lab"},
		{"Through a chain of gateways: `fwd`", "through-a-chain-of-gateways-fwd"},
		{"Unmodified servers: `vlink exec --serve`", "unmodified-servers-vlink-exec---serve"},
		{"8. The best-effort selector (issue 12)", "8-the-best-effort-selector-issue-12"},
		{"Drop-in `net.Dial`", "drop-in-netdial"},
		{"The [guide](docs/GUIDE.md)", "the-guide"},
		{"`proxy_from_environment`", "proxy_from_environment"},
	} {
		t.Run(tc.heading, func(t *testing.T) {
			if got := slug(tc.heading); got != tc.want {
				t.Errorf("slug(%q) = %q, want %q", tc.heading, got, tc.want)
			}
		})
	}
}

func TestParseMarkdown(t *testing.T) {
	d := parseMarkdown("# A\n## A\n[x](b.md#c) `[y](no.md)`\n```\n# not a heading [z](no.md)\n```\n<a id=\"here\"></a>\n")
	for _, a := range []string{"a", "a-1", "here"} {
		if !d.anchors[a] {
			t.Errorf("anchor %q missing from %v", a, d.anchors)
		}
	}
	if len(d.anchors) != 3 {
		t.Errorf("anchors %v, want a, a-1 and here", d.anchors)
	}
	if len(d.links) != 1 || d.links[0] != (mdLink{line: 3, target: "b.md#c"}) {
		t.Errorf("links %v, want b.md#c on line 3 only", d.links)
	}
}

// TestDocLinks checks that every relative link of the checkout's
// Markdown files names a file or folder that exists, and that every
// #anchor names a heading of the file it points into.
func TestDocLinks(t *testing.T) {
	root := moduleRoot(t)
	files := markdownFiles(t, root)
	docs := map[string]mdDoc{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = parseMarkdown(string(b))
	}
	checked := 0
	for _, f := range files {
		for _, l := range docs[f].links {
			if u, err := url.Parse(l.target); err != nil || u.Scheme != "" {
				continue // https:, mailto:: not this test's business
			}
			if msg := checkLink(root, f, l.target, docs); msg != "" {
				t.Errorf("%s:%d: link %q: %s", f, l.line, l.target, msg)
			}
			checked++
		}
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(files))
}

// checkLink says what is wrong with a relative link of file from, or "".
func checkLink(root, from, target string, docs map[string]mdDoc) string {
	path, anchor, _ := strings.Cut(target, "#")
	path, err := url.PathUnescape(path)
	if err != nil {
		return err.Error()
	}
	dest := from
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "an absolute path, which GitHub reads from the repository's root and a checkout from its disk's: write it relative"
		}
		dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(from), path)))
		if strings.HasPrefix(dest, "../") {
			return "leads out of the repository"
		}
		if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
			return "no such file or folder: " + dest
		}
	}
	if anchor == "" {
		return ""
	}
	d, ok := docs[dest]
	if !ok {
		return "an #anchor into " + dest + ", which is not a Markdown file"
	}
	if !d.anchors[anchor] {
		return "no heading of " + dest + " has the anchor #" + anchor
	}
	return ""
}

package main

import (
	"strings"
	"testing"
)

// A run with a pass, two skips for one reason and one for another, a
// failed subtest and a package that did not build.
const sample = `{"Action":"start","Package":"example/a"}
{"Action":"run","Package":"example/a","Test":"TestPass"}
{"Action":"output","Package":"example/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"pass","Package":"example/a","Test":"TestPass"}
{"Action":"output","Package":"example/a","Test":"TestLab","Output":"=== RUN   TestLab\n"}
{"Action":"output","Package":"example/a","Test":"TestLab","Output":"    lab_test.go:12: skipping: needs nft (Debian: nftables; integration/deps.sh installs it)\n"}
{"Action":"output","Package":"example/a","Test":"TestLab","Output":"--- SKIP: TestLab (0.00s)\n"}
{"Action":"skip","Package":"example/a","Test":"TestLab"}
{"Action":"output","Package":"example/a","Test":"TestLab2","Output":"    lab_test.go:40: skipping: needs nft (Debian: nftables; integration/deps.sh installs it)\n"}
{"Action":"skip","Package":"example/a","Test":"TestLab2"}
{"Action":"output","Package":"example/a","Test":"TestShort","Output":"    x_test.go:9: skipping in short mode\n"}
{"Action":"skip","Package":"example/a","Test":"TestShort"}
{"Action":"output","Package":"example/a","Test":"TestX/sub","Output":"    x_test.go:20: got 3, want 4\n"}
{"Action":"fail","Package":"example/a","Test":"TestX/sub"}
{"Action":"fail","Package":"example/a","Test":"TestX"}
{"Action":"fail","Package":"example/a"}
{"ImportPath":"example/b [example/b.test]","Action":"build-output","Output":"b.go:3:1: syntax error\n"}
{"Action":"fail","Package":"example/b","FailedBuild":"example/b [example/b.test]"}
`

func TestSummary(t *testing.T) {
	rep, err := read(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if rep.ok() {
		t.Error("a run with failures is ok")
	}
	var b strings.Builder
	rep.write(&b, "run")
	out := b.String()
	for _, want := range []string{
		"run: 1 passed, 3 skipped, 2 failed, in 2 packages (2 failed)\n",
		"    2  needs nft (Debian: nftables; integration/deps.sh installs it)\n    1  skipping in short mode\n",
		"--- FAIL: example/a TestX/sub\n    x_test.go:20: got 3, want 4\n",
		"b.go:3:1: syntax error",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the summary lacks %q:\n%s", want, out)
		}
	}
}

func TestSummaryPass(t *testing.T) {
	rep, err := read(strings.NewReader(`{"Action":"pass","Package":"p","Test":"T"}
{"Action":"pass","Package":"p"}
`))
	if err != nil || !rep.ok() {
		t.Fatalf("a passing run: ok=%v, %v", rep.ok(), err)
	}
}

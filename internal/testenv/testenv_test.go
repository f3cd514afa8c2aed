package testenv

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot is the checkout's top folder.
const moduleRoot = "../.."

// TestPackagesInDeps checks that every package a skip message names is
// one integration/deps.sh installs, so the advice in the message works.
func TestPackagesInDeps(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(moduleRoot, Install))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)packages=\((.*?)\)`).FindSubmatch(script)
	if m == nil {
		t.Fatalf("%s has no packages=( ... ) list", Install)
	}
	listed := map[string]bool{}
	for _, pair := range strings.Fields(string(m[1])) {
		pkg, _, _ := strings.Cut(pair, ":")
		listed[pkg] = true
	}
	for prog, pkg := range packages {
		if !listed[pkg] {
			t.Errorf("%s: package %s is not in %s", prog, pkg, Install)
		}
	}
}

// TestMissingMessage checks the one line a skipped test prints.
func TestMissingMessage(t *testing.T) {
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"nft"}, "needs nft (Debian: nftables; integration/deps.sh installs it)"},
		{[]string{"ip", "ss", "sshd"}, "needs ip, ss, sshd (Debian: iproute2, openssh-server; integration/deps.sh installs it)"},
		{[]string{"no-such-tool"}, "needs no-such-tool"},
	} {
		if got := missingError(tc.names).Error(); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.names, got, tc.want)
		}
	}
}

// TestLookPath finds programs in the sbin folders with a PATH that
// leaves them out, as an ordinary user's does, and nothing else there.
func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "vlink-testenv-daemon")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := sbin
	sbin = []string{dir}
	t.Cleanup(func() { sbin = saved })
	t.Setenv("PATH", t.TempDir())
	if p, err := LookPath("vlink-testenv-daemon"); err != nil || p != prog {
		t.Errorf("LookPath = %q, %v; want %q", p, err, prog)
	}
	if Has("vlink-testenv-daemon", "vlink-testenv-none") {
		t.Error("Has reports a program that does not exist")
	}
	if p, err := LookPath("./vlink-testenv-daemon"); err == nil {
		t.Errorf("a relative path was looked up in sbin: %q", p)
	}
}

// TestStrict checks both switches and that nothing else turns it on.
func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		ci, strict string
		want       bool
	}{
		{"", "", false},
		{"true", "", true},
		{"", "1", true},
		{"false", "0", false},
		{"1", "", false}, // CI=true is the convention CI follows
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv(EnvStrict, tc.strict)
		if got := Strict(); got != tc.want {
			t.Errorf("CI=%q %s=%q: Strict() = %v", tc.ci, EnvStrict, tc.strict, got)
		}
	}
}

// TestOneHelper keeps this package the only place where tests decide
// whether a requirement is met: a test that reads CI, looks programs up or
// checks for root by itself escapes both the bare-machine run and
// strict mode. Non-test code (the lab, the preload builder) may look
// programs up for its own use.
func TestOneHelper(t *testing.T) {
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if abs, _ := filepath.Abs(path); abs == self || strings.HasPrefix(d.Name(), ".") && path != moduleRoot {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		isTest := strings.HasSuffix(path, "_test.go")
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			name := pkg.Name + "." + sel.Sel.Name
			var bad string
			switch {
			case name == "os.Getenv" && len(call.Args) == 1 && isString(call.Args[0], "CI"):
				bad = "reads CI: use testenv.Strict"
			case isTest && name == "exec.LookPath":
				bad = "looks a program up: use testenv.Programs or testenv.Has"
			case isTest && (name == "os.Geteuid" || name == "os.Getuid"):
				bad = "checks for root: use testenv.Root or testenv.IsRoot"
			}
			if bad != "" {
				t.Errorf("%s %s", fset.Position(call.Pos()), bad)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isString(e ast.Expr, want string) bool {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return false
	}
	s, err := strconv.Unquote(lit.Value)
	return err == nil && s == want
}

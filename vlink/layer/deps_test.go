package layer_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const (
	module = "github.com/vlink-dev/vlink"
	appPkg = module + "/vlink" // the application's API
)

// layerPatterns are the packages that hold layers, or serve them: each
// needs only package layer (and netconn, vio...), never package vlink.
var layerPatterns = []string{"factories/...", "filters/...", "parallelstreams/...", "vlink/layer/..."}

// mayUseVlink are the layer packages allowed to import package vlink:
// the factories that reach nodes dial through a vlink network
// (vlink.Dialer.Network) and name its addresses (vlink.SplitNodeAddr).
var mayUseVlink = []string{module + "/factories/rendezvous"}

// TestLayersNeedOnlyLayer checks the rule that makes package layer the
// whole contract of a layer: no layer package depends on package vlink,
// directly or through another package, on any platform the project
// builds for. A layer that wants a name of vlink's asks for it to move
// here (vlink then re-exports it), as database/sql/driver serves drivers.
func TestLayersNeedOnlyLayer(t *testing.T) {
	for _, goos := range []string{"linux", "darwin", "windows"} {
		t.Run(goos, func(t *testing.T) {
			// Every package in the patterns' dependency graph, with its
			// direct imports; roots are those the patterns name.
			args := []string{"list", "-deps", "-f", "{{if not .DepOnly}}root {{end}}{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}
			for _, p := range layerPatterns {
				args = append(args, module+"/"+p)
			}
			cmd := exec.Command("go", args...)
			cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64")
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("go list: %v\n%s", err, stderr)
			}
			imports := map[string][]string{}
			var roots []string
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				f := strings.Fields(line)
				if f[0] == "root" {
					f = f[1:]
					roots = append(roots, f[0])
				}
				imports[f[0]] = f[1:]
			}
			if len(roots) < 10 {
				t.Fatalf("go list found %d layer packages, want every one: %v", len(roots), roots)
			}
			for _, root := range roots {
				if slices.Contains(mayUseVlink, root) {
					continue
				}
				if chain := importChain(imports, root, appPkg); chain != nil {
					for i := range chain {
						chain[i] = strings.TrimPrefix(chain[i], module+"/")
					}
					t.Errorf("%s depends on package vlink (%s): a layer needs only package layer; move the names it uses there, for vlink to re-export",
						chain[0], strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// importChain returns the shortest chain of imports from one package to
// another, or nil if from does not depend on to.
func importChain(imports map[string][]string, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == to {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink/layer"
)

var layersCmd = &cli.Command{
	Name:     "layers",
	Summary:  "list the registered layers and their parameters",
	Synopsis: "[flags]",
	About: `
Lists every layer this binary knows, by name: its kind, what it does, and
its parameters with their type, default and bounds. Stacks name layers and
set parameters as in zstd:level=3+tcp. The kinds, from the top of a stack
down:

  - filter: transforms the byte stream (compression, encryption); the
    peer mirrors it;
  - multi-link: builds one stream out of several connections of the
    layers below (parallel), or many streams over one (mux); the peer
    mirrors it;
  - route: reaches the peer through another node, which forwards the
    stream unread (fwd); not mirrored;
  - factory: makes the byte stream to the next hop, at the bottom (tcp,
    ssh, socks5, and reverse, splice and relay to the nodes of a vlink
    network); "terminal" ones reach the network themselves and end a
    stack, where ssh or socks5 reach their server through the layers
    below them (tcp when none is written).
`,
	Examples: `
  vlink layers
`,
	Flags: base.WithEnv(func(fs *flag.FlagSet) func(context.Context, *base.Env) int {
		return func(ctx context.Context, e *base.Env) int {
			printLayers(e)
			return base.ExitOK
		}
	}),
}

func printLayers(e *base.Env) {
	for i, s := range layer.Specs() {
		if i > 0 {
			fmt.Fprintln(e.Stdout)
		}
		kind := s.Kind.String()
		if s.Terminal {
			kind += ", terminal"
		}
		fmt.Fprintf(e.Stdout, "%s (%s): %s\n", s.Name, kind, s.Summary)
		w := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
		for _, p := range s.Params {
			def, bounds := "default "+p.Default, ""
			switch {
			case p.Required:
				def = "required"
			case p.Default == "":
				def = "default none"
			}
			if p.Min != 0 || p.Max != 0 {
				bounds = "range " + p.Format(p.Min) + ".." + p.Format(p.Max)
			}
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", p.Name, p.Type, def, bounds, p.Doc)
		}
		w.Flush()
	}
}

var versionCmd = &cli.Command{
	Name:     "version",
	Summary:  "print the version of vlink and of Go it was built with",
	Synopsis: "[flags]",
	About: `
Prints the module version (a release tag, a pseudo-version from the VCS
when built in a checkout, or "(devel)"), the VCS revision if known, and the
Go version and platform.
`,
	Examples: `
  vlink version
`,
	Flags: base.WithEnv(func(fs *flag.FlagSet) func(context.Context, *base.Env) int {
		return func(ctx context.Context, e *base.Env) int {
			fmt.Fprintln(e.Stdout, versionString())
			return base.ExitOK
		}
	}),
}

func versionString() string {
	version, rev := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		// A pseudo-version names the revision already.
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if strings.Contains(version, rev) {
			rev = ""
		}
		if rev != "" && modified {
			rev += ", modified"
		}
	}
	s := "vlink " + version
	if rev != "" {
		s += " (" + rev + ")"
	}
	return fmt.Sprintf("%s %s %s/%s", s, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

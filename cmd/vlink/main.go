// Command vlink is the single binary of the vlink project: it serves VLink
// stacks on a port and forwards what it accepts (serve), carries local TCP
// connections through a stack (tunnel), or standard input and output
// (connect, an ssh ProxyCommand), runs a SOCKS server whose connections
// follow stacks (socks), runs unmodified programs with their connections
// on stacks (exec), starts jobs of N processes that reach each other by
// rank (launch), runs a vlink network's rendezvous (relay), explains
// which way a destination takes (route), makes keys (key), makes a
// network owner's key and signs its nodes' certificates with it (owner,
// cert), measures every stack on loopback against raw TCP (bench), and
// lists what it knows (layers, version).
//
// Run "vlink --help" or "vlink COMMAND --help" for the usage; USAGE.txt
// beside this file holds all of it.
package main

import (
	"context"
	"io"
	"log"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/bench"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/dial"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/execcmd"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/launcher"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/serve"
	"github.com/vlink-dev/vlink/factories/quic"
	"github.com/vlink-dev/vlink/internal/cli"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func main() {
	// The standard logger is quic-go's alone, which uses it once to say
	// that the system keeps UDP socket buffers smaller than it wants (a
	// tuning hint, in ARCHITECTURE §14): not for the stderr of a program
	// run under vlink exec.
	log.SetOutput(io.Discard)
	program.Main()
}

var program = &cli.Program{
	Name: "vlink",
	Intro: `vlink carries TCP connections through stacks of layers (compression,
parallel streams, multiplexing; SSH, SOCKS and HTTP proxies to cross
firewalls), with a VLink peer mirroring the stack on the other side, and
runs unmodified programs on them.
`,
	Usage: "COMMAND [flags]",
	Examples: `  vlink bench --size 16M
  vlink layers
`,
	ExitCodes: `Exit codes:
  0  success (also --help, and a server stopped by SIGINT or SIGTERM)
  1  runtime failure
  2  usage error
`,
	Commands: []*cli.Command{serve.Cmd, dial.TunnelCmd, dial.ConnectCmd, dial.SocksCmd, relayCmd, execcmd.Cmd, launcher.Cmd, routeCmd, keyCmd, ownerCmd, certCmd, bench.Cmd, layersCmd, versionCmd},
	Aliases:  map[string]string{"-version": "version", "--version": "version"},
	// QUIC runs in this process: closing its connections tells each peer
	// the path ended now, rather than at its idle timeout.
	AtExit: quic.CloseAll,
}

// run is the whole program with its environment passed in, so tests call
// it directly. Cancelling ctx is what SIGINT and SIGTERM do, except to
// vlink exec, which passes them on to its program.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return program.Run(ctx, args, stdout, stderr)
}

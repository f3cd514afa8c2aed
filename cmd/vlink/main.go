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
	// As docs/REFERENCE.md lists them, in short.
	Environment: []cli.Entry{
		{Name: "VLINK_CONFIG", Doc: "the configuration file, instead of $XDG_CONFIG_HOME/vlink/config.toml"},
		{Name: "VLINK_STACK, VLINK_VIA", Doc: "the stack, and its gateway, for destinations no route of the configuration matches"},
		{Name: "VLINK_KEY_FILE", Doc: "the pre-shared key file (mode 600), as --key-file"},
		{Name: "VLINK_NODE", Doc: "this host's node name, as the configuration's node"},
		{Name: "VLINK_PATHS_ONLY, VLINK_PATHS_EXCLUDE", Doc: "narrow best-effort routes' ways, and the paths to nodes"},
		{Name: "VLINK_SHM", Doc: "auto, on or off: shared memory between local processes, as the configuration's shm, and between a launch job's ranks of one host"},
		{Name: "VLINK_PROXY_FROM_ENVIRONMENT", Doc: "1: take ALL_PROXY, HTTPS_PROXY and NO_PROXY, as the configuration's proxy_from_environment"},
		{Name: "XDG_CONFIG_HOME", Doc: "the folder of vlink/config.toml and vlink/known_nodes (default ~/.config)"},
		{Name: "VLINK_PRELOAD", Doc: "vlink exec: a prebuilt shim (vlink exec --build-shim), for machines without cc"},
		{Name: "VLINK_AGENT, VLINK_AGENT_TOKEN", Doc: "set by vlink exec for the program: its agent's socket, and the secret of the program's processes"},
		{Name: "VLINK_RANK, VLINK_SIZE, VLINK_RELAY, VLINK_NODE_KEY_FILE, VLINK_JOB", Doc: "set by vlink launch for each worker (VLINK_JOB: the job's id, by which ranks of one host find each other over shared memory)"},
		{Name: "VLINK_LAUNCH_SECRET", Doc: "set by vlink launch --custom for the command it runs, which must pass it on to the workers (mpirun -x VLINK_LAUNCH_SECRET)"},
		{Name: "VLINK_SPAWNER, VLINK_SSH_SERVERS, VLINK_HOSTFILE, VLINK_SSH_OPTIONS, VLINK_REMOTE_DIR, VLINK_CSPAWN_CMD, VLINK_CSPAWN_SERVERS", Doc: "defaults of vlink launch's spawner flags"},
	},
	Files: []cli.Entry{
		{Name: "$XDG_CONFIG_HOME/vlink/config.toml", Doc: "the routes and settings every command dialing with the user's configuration reads (docs/REFERENCE.md, Configuration file)"},
		{Name: "$XDG_CONFIG_HOME/vlink/known_nodes", Doc: "the identities of the listeners and nodes met so far, pinned on first use (vlink owner)"},
		{Name: "vlink.key", Doc: "a pre-shared key (vlink key), given with --key-file; mode 600"},
		{Name: "~/.cache/vlink", Doc: "vlink exec's shim, built there with cc once per version"},
		{Name: "docs/systemd/vlink@.service", Doc: "in the source: a unit running vlink tunnel or serve --forwards under systemd"},
	},
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

// Package execcmd is "vlink exec": it runs an unmodified program
// with the preload shim and a private agent, so that the program's TCP
// connections follow vlink stacks (and, with --serve, its listeners take
// VLink clients).
package execcmd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// Exit codes of vlink exec besides the program's own, as env(1) and
// timeout(1) use them: the program's code passes through, so vlink exec's
// own failures need codes programs rarely use. A program killed by a
// signal makes vlink exec die by the same signal.
const (
	ExitExecFailed = 125 // vlink exec itself failed: shim, agent, unreachable program
	exitCannotRun  = 126 // the program exists but cannot be run
	exitNotFound   = 127 // no such program
)

var Cmd = &cli.Command{
	Name:     "exec",
	Summary:  "run an unmodified program with its TCP connections on vlink stacks",
	Synopsis: "[--stack STACK [--via HOST:PORT] | --config FILE] [flags] -- PROGRAM [ARGS...]",
	About: `
Runs PROGRAM with a preload shim (LD_PRELOAD) that sends its TCP connections
where the rules say, as vlink.Dial would for a Go program: direct, through
a stack (and a vlink serve gateway), or refused. Nothing in the program
changes; its connect, name resolution and getpeername behave as without
the shim. A blocking connect through a stack waits for the far side and
returns its errno; a non-blocking one (event loops) returns at once, and
its socket becomes writable when the far side accepted, or reports the far
side's errno in SO_ERROR.

  - --stack STACK [--via GATEWAY]: every destination goes through STACK,
    except loopback (localhost, 127.0.0.0/8, ::1), which stays direct. With
    --via, the gateway (vlink serve --allow) dials each destination; names
    are resolved there, so a host only the far side knows can be reached.
  - --config FILE: the routes of a vlink config file (docs/REFERENCE.md).
  - neither: the user's configuration (VLINK_CONFIG, default
    ~/.config/vlink/config.toml, VLINK_STACK, VLINK_VIA, VLINK_KEY_FILE);
    with none, everything goes direct.

A private agent (inside this process) decides each connect and dials; it
lives until the program and every process it leaves behind have exited, and
leaves no socket or file behind. It serves the processes of the user who
ran vlink exec, and the program's own processes that became another user (a
daemon's workers): descendants of vlink exec that hold the secret it put in
the program's environment (VLINK_AGENT_TOKEN). It refuses every other
process on the machine. The program's stderr is its own output: vlink
exec adds only warnings and errors to it. --log-level info or debug adds
more; --log-file sends vlink's log (info and above) to a file instead.

A connect the rules refuse fails with EPERM; if the agent is gone,
connects it must route fail with ENETUNREACH, never silently direct.
Names routed through a stack get addresses from 198.18.0.0/15 and
fd76:6c69:6e6b::/96, which the agent maps back to the name, after asking
the gateway whether the name exists and with which address families (one
round trip per name, cached; a name it does not know fails to resolve, as
without the shim). --stand-ins skips the question. UDP to a routed
destination is carried too (the gateway needs --allow-udp), through a
relay of vlink exec's on loopback that the program sees as the
destination; the first datagram dials, and a session idle for 2 minutes
closes.

With --serve PORTS, the program's listeners on those ports take VLink
clients besides their own: the shim binds the program's socket to a
loopback port, vlink exec listens on the address the program asked for
(with the policy of --serve-key-file, --serve-layers and --serve-plain),
and hands each client over: a plain one as its own socket, a VLink one
relayed, with its address in accept and getpeername.

The shim is C, built once with the system's C compiler (cc) into the user's
cache directory; VLINK_PRELOAD names a prebuilt one instead. Statically
linked programs, Go programs and set-user-ID programs cannot be reached by a
preload shim: vlink exec says so and refuses to run them, unless
--allow-bypass (their connections then go direct). Only PROGRAM (or the
interpreter of a script) is checked, not what it runs later.

Signals reach PROGRAM as without vlink exec. SIGINT and SIGQUIT from the
terminal (Ctrl-C, Ctrl-\) reach it from the terminal itself: vlink exec
neither passes them on again nor ends PROGRAM for them, so a program that
handles Ctrl-C goes on. SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGUSR1 and
SIGUSR2 sent to vlink exec alone are passed on to PROGRAM as they are,
once, and vlink exec waits for it; once PROGRAM has exited, they go to the
processes it left running. When a signal kills PROGRAM, vlink exec cleans
up and kills itself with the same signal (without a core file), as if
PROGRAM had run in its place: a shell loop stops on Ctrl-C, a crash reads
"Segmentation fault".
`,
	ExitCodes: `Exit codes:
  N    PROGRAM's own exit status (0 also for --help); a signal that kills
       PROGRAM kills vlink exec too
  125  vlink exec itself failed (no shim, an unusable configuration...)
  126  PROGRAM cannot be run (not executable, static, Go or set-user-ID)
  127  PROGRAM was not found
  2    usage error
`,
	Examples: `
  # With "vlink serve --listen 0.0.0.0:7000 --allow '*:*' --key-file k"
  # on the gateway: curl reaches a host only the gateway can resolve,
  # zstd-compressed up to the gateway:
  vlink exec --stack zstd --via gateway.example:7000 --key-file k -- \
      curl http://intranet.corp:8080/

  # The routes of a config file, for any program:
  vlink exec --config ~/.config/vlink/work.toml -- git clone http://git.corp/repo.git

  # redis takes VLink clients (with the key in k) besides its own:
  vlink exec --serve 6379 --serve-key-file k -- redis-server --port 6379

  # See every decision the agent makes:
  vlink exec --log-level debug --stack lz4 --via 10.0.0.1:7000 -- ssh build.corp
`,
	Args: true,
	// Signals go to the program, as they would without vlink exec: they
	// do not cancel the context.
	OwnSignals: true,
	// The program's stderr is its output: vlink exec adds warnings and
	// errors only, unless told otherwise.
	Flags: base.WithEnvAt(slog.LevelWarn, "; with --log-file, info", execFlags),
}

type execOptions struct {
	stack, via, keyFile, config string
	knownNodes, logFile         string
	dialTimeout                 time.Duration
	allowBypass, plaintext      bool
	standIns                    bool
	node                        base.NodeOptions
	network                     vlink.NodeDialer // the node's, once connected
	metrics                     string
	m                           *metrics.Metrics // once serving
	buildShim                   string
	serve                       execServeOptions
	servePorts                  []uint16     // from serve, once checked
	servePolicy                 vlink.Policy // likewise
}

// execServeOptions are the flags of --serve: the program's listeners
// taking VLink clients.
type execServeOptions struct {
	ports, keyFile, layers, plain string
}

// config builds what the agent needs to serve in the program's place; nil
// without --serve.
func (o *execServeOptions) config() (ports []uint16, policy vlink.Policy, err error) {
	if o.ports == "" {
		if o.keyFile != "" || o.layers != "" || o.plain != "allow" {
			return nil, policy, base.Usagef("--serve-key-file, --serve-layers and --serve-plain need --serve")
		}
		return nil, policy, nil
	}
	for p := range strings.SplitSeq(o.ports, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 16)
		if err != nil || n == 0 {
			return nil, policy, base.Usagef("--serve: %q is not a port (1-65535); give a comma list, e.g. 8080,6379", p)
		}
		if !slices.Contains(ports, uint16(n)) {
			ports = append(ports, uint16(n))
		}
	}
	if len(ports) > 64 {
		return nil, policy, base.Usagef("--serve: %d ports, at most 64", len(ports))
	}
	if o.layers != "" {
		if policy.Layers, err = base.ParseLayerList("--serve-layers", o.layers); err != nil {
			return nil, policy, err
		}
	}
	if o.keyFile != "" {
		if policy.Key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
			return nil, policy, err
		}
	}
	switch o.plain {
	case "allow":
		policy.Plain = vlink.PlainAllow
	case "refuse":
		policy.Plain = vlink.PlainRefuse
	default:
		return nil, policy, base.Usagef("--serve-plain: %q, want allow or refuse", o.plain)
	}
	return ports, policy, nil
}

func execFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &execOptions{}
	fs.StringVar(&o.stack, "stack", "", "carry every connection but loopback through `STACK`, e.g. zstd or lz4+tcp (default: the configuration decides)")
	fs.StringVar(&o.via, "via", "", "go through the VLink gateway at `HOST:PORT` (vlink serve --allow), which resolves the names and dials the destinations; needs --stack (default: none)")
	fs.StringVar(&o.keyFile, "key-file", "", "prove to the gateway that we hold the pre-shared key in `FILE`; needs --stack (default: none)")
	fs.StringVar(&o.config, "config", "", "route with the vlink config `FILE` instead of --stack (default: VLINK_CONFIG and the other VLINK_ variables)")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 0, "give up a connection through a stack, handshake included, after `DURATION` (default: as the kernel's own connect gives up on a host that does not answer, about 2 minutes: net.ipv4.tcp_syn_retries; a program's shorter timeout still decides, as without vlink)")
	base.KnownNodesVar(fs, &o.knownNodes)
	base.InsecurePlaintextVar(fs, &o.plaintext)
	fs.StringVar(&o.logFile, "log-file", "", "append vlink's log to `FILE` instead of writing it to the program's stderr (default: stderr)")
	fs.BoolVar(&o.standIns, "stand-ins", false, "answer names the far side resolves with stand-in addresses at once, without asking it whether they exist: a round trip less per new name, but a name nobody knows then fails at connect, not at resolution")
	fs.BoolVar(&o.allowBypass, "allow-bypass", false, "run a static, Go or set-user-ID program even though its connections bypass vlink")
	base.NodeFlags(fs, &o.node, "so that the program reaches other nodes' ports as NODE.vlink.alt:PORT through the relay")
	base.ReverseFlag(fs, &o.node)
	metrics.FlagVar(fs, &o.metrics)
	fs.StringVar(&o.serve.ports, "serve", "", "let the program's listeners on `PORTS` (a comma list) take VLink clients besides their own: vlink exec listens there in their place and hands each client over, a plain one as its own socket (default: none)")
	fs.StringVar(&o.serve.keyFile, "serve-key-file", "", "with --serve: require VLink clients to prove they hold the pre-shared key in `FILE` (default: no authentication)")
	fs.StringVar(&o.serve.layers, "serve-layers", "", "with --serve: let VLink clients ask only for the layers in the comma-separated `LIST` (default: every registered filter)")
	fs.StringVar(&o.serve.plain, "serve-plain", "allow", "with --serve: what to do with plain clients (no hello), `MODE`: allow (hand them to the program, as without vlink) or refuse (VLink clients only)")
	fs.StringVar(&o.buildShim, "build-shim", "", "compile the shim into `FILE` and exit, running no program: for a machine where vlink exec cannot compile it (no cc), copy FILE there and set VLINK_PRELOAD=FILE (same architecture and C library)")
	return func(ctx context.Context, e *base.Env) int {
		return o.run(ctx, e)
	}
}

// loopbackRules keep local destinations direct under --stack: a gateway's
// loopback is another host's.
var loopbackRules = []selector.Rule{
	{Host: "localhost", Action: selector.Direct},
	{Host: "*.localhost", Action: selector.Direct},
	{Host: "127.0.0.0/8", Action: selector.Direct},
	{Host: "::1", Action: selector.Direct},
}

// routes builds the configuration the flags describe.
func (o *execOptions) routes() (*vlink.Config, error) {
	if o.dialTimeout < 0 {
		return nil, base.Usagef("--dial-timeout wants a positive duration")
	}
	if o.config != "" && (o.stack != "" || o.via != "" || o.keyFile != "") {
		return nil, base.Usagef("give --config or --stack (with --via and --key-file), not both")
	}
	if o.config != "" {
		return vlink.LoadConfig(o.config)
	}
	if o.stack == "" {
		if o.via != "" || o.keyFile != "" {
			return nil, base.Usagef("--via and --key-file need --stack (--stack tcp for no filter); without --stack the configuration decides")
		}
		return vlink.DefaultConfig()
	}
	s, err := vlink.Parse(o.stack)
	if err != nil {
		return nil, base.Usagef("--stack: %v", err)
	}
	if o.keyFile != "" {
		if err := base.CheckKeyCarried(o.stack, s, o.via, &o.node); err != nil {
			return nil, err
		}
	}
	if o.via != "" {
		if err := base.CheckHostPort(o.via); err != nil {
			return nil, base.Usagef("--via %v", err)
		}
	}
	var key []byte
	if o.keyFile != "" {
		if key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
			return nil, err
		}
	}
	return vlink.NewConfig(loopbackRules, selector.Rule{Stack: o.stack, Via: o.via}, key)
}

func (o *execOptions) run(ctx context.Context, e *base.Env) int {
	if o.buildShim != "" {
		if len(e.Args) > 0 {
			return base.UsageError(e.Stderr, "vlink exec", "--build-shim builds the shim and runs no program")
		}
		if err := buildShimTo(o.buildShim); err != nil {
			fmt.Fprintf(e.Stderr, "vlink exec: %v\n", err)
			return ExitExecFailed
		}
		fmt.Fprintf(e.Stdout, "%s\n", o.buildShim)
		return base.ExitOK
	}
	if len(e.Args) == 0 {
		return base.UsageError(e.Stderr, "vlink exec", "no program to run: give it after the flags, e.g. vlink exec --stack zstd --via gw:7000 -- curl http://host/")
	}
	if o.logFile != "" {
		f, err := os.OpenFile(o.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			fmt.Fprintf(e.Stderr, "vlink exec: --log-file: %v\n", err)
			return ExitExecFailed
		}
		defer f.Close()
		level := e.Level
		if !e.LevelSet {
			level = slog.LevelInfo // a file of its own keeps what stderr would not
		}
		e.Log = base.NewLogger(f, e.LogFormat, level)
		e.Level = level
	}
	base.WarnPassword(e, "--stack", o.stack)
	var err error
	if o.servePorts, o.servePolicy, err = o.serve.config(); err != nil {
		return base.Fail(e, "vlink exec", err)
	}
	cfg, err := o.routes()
	if err != nil {
		code := base.Fail(e, "vlink exec", err)
		if code == base.ExitFailure {
			code = ExitExecFailed
		}
		return code
	}
	withPins := *cfg // the agent's dialers check identities against the pins
	base.SetPins(o.knownNodes, e.Log, &withPins.PeerKey, &withPins.PinnedKey)
	cfg = &withPins
	if o.node.Given() {
		node, err := o.node.Connect(ctx, e, cfg.Key)
		if err != nil {
			code := base.Fail(e, "vlink exec", err)
			if code == base.ExitFailure {
				code = ExitExecFailed
			}
			return code
		}
		defer node.Close()
		o.network = node
	} else if cfg.Selector() == nil && o.serve.ports == "" {
		e.Log.Warn("no --stack, --config or vlink configuration: every connection goes direct")
	}
	m, stopMetrics, err := metrics.Serve(ctx, e, o.metrics)
	if err != nil {
		code := base.Fail(e, "vlink exec", err)
		if code == base.ExitFailure {
			code = ExitExecFailed
		}
		return code
	}
	defer stopMetrics()
	o.m = m
	code, err := execProgram(ctx, e, o, cfg)
	if err != nil {
		fmt.Fprintf(e.Stderr, "vlink exec: %v\n", err)
	}
	return code
}

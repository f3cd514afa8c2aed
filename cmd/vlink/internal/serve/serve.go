// Package serve is "vlink serve": it accepts VLink and plain
// connections on a port, checks them against the command's policy, and
// forwards them to the targets allowed.
package serve

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/forward"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/proxyproto"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/knownnodes"
	"github.com/vlink-dev/vlink/vlink/layer"
)

var Cmd = &cli.Command{
	Name:     "serve",
	Summary:  "accept VLink and plain connections on a port and forward them",
	Synopsis: "(--target HOST:PORT | --allow PATTERN ... | --hop PATTERN ... | --forwards FILE) [flags]",
	About: `
Accepts VLink connections (from "vlink tunnel", or any program dialing with
the vlink library) and plain TCP connections on one port, and forwards each:

  - a VLink connection gets the stack its dialer asks for mirrored (within
    --layers and --limit), then goes to the target it names if an --allow
    pattern matches it, or to --target if it names none;
  - a VLink datagram session (vlink tunnel --udp) has each datagram it
    carries sent on as UDP to the target it names, if an --allow-udp
    pattern matches it, and the answers returned, until it falls idle
    (--udp-idle-timeout);
  - a plain connection (one that sends no hello) goes to --target;
  - a VLink connection that goes through this node to other nodes (the
    fwd layer, or vlink tunnel --via A,B,C) is carried on to the next node
    it names if a --hop pattern matches it, reached through --hop-stack;
    nothing is mirrored here: the layers run end to end, and this node
    relays bytes it does not read. With --key-file the nodes of a route
    prove the key to each other and vouch for the connection's origin,
    which each node logs and the last can pass on (--proxy-protocol).

serve is never an open proxy: it needs --target, --allow, --allow-udp or
--hop, and a target or next node a dialer names is refused unless a
pattern matches it; --allow lets streams through, --allow-udp datagrams.
Patterns match the target as the dialer wrote it, without resolving names,
so an IP pattern only matches targets given as IP addresses.

The target is dialed before a VLink dialer is accepted, so the dialer
learns when the target is unreachable, and why. With --key-file every VLink
dialer must prove it holds the same key (a challenge-response: the key
never crosses the wire, and a recorded handshake cannot be replayed), and
plain connections are refused unless --plain allow. Listening beyond
loopback is done only when --listen says so, and is warned about without a
key.

With --forwards FILE, one process serves on many ports: FILE is TOML, one
[[forward]] table per listener, whose keys are the flags of one listener
without their dashes (a repeatable flag takes a list), and name = "..." to
name it in the log. SIGHUP rereads the file (see --forwards); without
--forwards it is logged and ignored. The example unit
docs/systemd/vlink@.service runs it under systemd.
`,
	Examples: `
  # Forward port 7000 to a local web server; tunnels may use any filter:
  vlink serve --listen 127.0.0.1:7000 --target 127.0.0.1:8000

  # A gateway on every interface, with a key: tunnels name targets in
  # 10.0.0.0/8 or under corp.example:443, and may use zstd (levels 1-9)
  # or lz4 only:
  head -c 32 /dev/urandom | base64 > vlink.key && chmod 600 vlink.key
  vlink serve --listen 0.0.0.0:7000 --key-file vlink.key \
      --allow 10.0.0.0/8:1-65535 --allow '*.corp.example:443' \
      --layers zstd,lz4 --limit zstd.level=1-9

  # A node of a chain: carries tunnels on to gw2 (reached through a SOCKS
  # proxy), without reading them; a tunnel crosses both nodes with
  # vlink tunnel --via gw1:7000,gw2:7000 --stack zstd --to db:5432
  vlink serve --listen 0.0.0.0:7000 --key-file vlink.key \
      --hop 'gw2.example:7000' --hop-stack socks5:addr=proxy:1080

  # A gateway that tells its web server where each connection came from
  # (nginx: listen 8080 proxy_protocol):
  vlink serve --listen 0.0.0.0:7000 --key-file vlink.key \
      --allow 127.0.0.1:8080 --proxy-protocol 127.0.0.1:8080

  # Two listeners in one process; after editing the file, kill -HUP
  # reloads it:
  cat > serve.toml <<'EOF'
  [[forward]]
  name = "gateway"
  listen = "0.0.0.0:7000"
  key_file = "vlink.key"   # relative to the file's folder
  allow = ["10.0.0.0/8:1-65535", "*.corp.example:443"]

  [[forward]]
  name = "web"
  listen = "127.0.0.1:7001"
  target = "127.0.0.1:8000"
  EOF
  vlink serve --forwards serve.toml
`,
	Flags: base.WithEnv(serveFlags),
}

type serveOptions struct {
	listen, target, keyFile, layers, plain string
	identityFile                           string
	refuseEarly                            bool
	listenStack, hopStack                  string
	shm                                    bool
	quic                                   bool
	quicCert                               string
	allow, limits, hops, proxyProtocol     base.ListFlag
	allowUDP                               base.ListFlag
	handshakeTimeout, dialTimeout          time.Duration
	maxDialTimeout                         time.Duration
	idleTimeout, udpIdleTimeout            time.Duration
	udpSessions, udpPerClient              int
	insecurePlaintext                      bool
	eventLoop                              bool
	node                                   base.NodeOptions
}

func serveFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	p := &forward.ProcessOptions{}
	p.Flags(fs)
	o := &serveOptions{}
	o.flags(fs)
	return func(ctx context.Context, e *base.Env) int {
		if err := p.Run(ctx, e, fs, o.prepare, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
			o := &serveOptions{}
			o.flags(fs)
			return o.prepare
		}); err != nil {
			return base.Fail(e, "vlink serve", err)
		}
		return base.ExitOK
	}
}

// flags defines the flags of one forward: those a --forwards file's
// entries take.
func (o *serveOptions) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7000", "accept connections on `ADDR` (host:port); a non-loopback address serves other hosts")
	fs.StringVar(&o.target, "target", "", "forward plain connections, and VLink connections that name no target, to `HOST:PORT` (default: none)")
	fs.Var(&o.allow, "allow", "let VLink dialers name targets matching `PATTERN`, written HOST:PORTS: HOST is a name glob (*.corp.example), an IP or a CIDR prefix (10.0.0.0/8, [fd00::1]); PORTS is a port, a range, a comma list or * (repeatable; default: none)")
	fs.Var(&o.allowUDP, "allow-udp", "let VLink dialers open datagram sessions (vlink tunnel --udp, Dialer.Dial(\"udp\", ...)) to targets matching `PATTERN` (HOST:PORTS, as --allow) and relay their datagrams there as UDP; separate from --allow, so a target that takes streams takes no datagrams unless named here too (repeatable; default: none)")
	fs.DurationVar(&o.udpIdleTimeout, "udp-idle-timeout", defaultUDPIdleTimeout, "end a datagram session that carried no datagram either way for `DURATION`, as a NAT forgets a mapping; the next datagram starts a new one")
	fs.IntVar(&o.udpSessions, "udp-sessions", defaultUDPSessions, "relay at most `N` datagram sessions at once (each holds a UDP socket); dialers beyond are refused as busy")
	fs.IntVar(&o.udpPerClient, "udp-sessions-per-client", defaultUDPSessions/4, "of those, at most `N` for one client address (the dialer's origin), so one client cannot take them all")
	fs.Var(&o.hops, "hop", "let VLink dialers route through this node to a next node matching `PATTERN` (HOST:PORTS, as --allow): the next node must be a VLink listener, vlink serve (repeatable; default: none)")
	fs.StringVar(&o.hopStack, "hop-stack", "tcp", "reach next nodes through the factories of `STACK` (ssh:host=bastion, socks5:addr=proxy:1080, ...)")
	fs.Var(&o.proxyProtocol, "proxy-protocol", "send targets matching `PATTERN` (HOST:PORTS, as --allow) a PROXY protocol v2 header with the connection's origin, as nginx (listen ... proxy_protocol) and haproxy (accept-proxy) take it; only for targets that expect it (repeatable; default: none)")
	fs.StringVar(&o.keyFile, "key-file", "", "require VLink dialers to prove they hold the pre-shared key in `FILE` (at least 16 bytes, mode 600; default: no authentication)")
	fs.BoolVar(&o.refuseEarly, "refuse-early-data", false, "with --identity: take no early data (a client's first bytes in its first flight, which cost it a round trip less); set it where another serve shares this identity file, since their replay records are not shared (ARCHITECTURE §2)")
	fs.StringVar(&o.identityFile, "identity", "", "prove this listener's identity, the X25519 key in `FILE` (mode 600; make one with vlink key --identity), in each encrypted connection, so dialers can pin it on first use and notice if it changes, and take early data (see --refuse-early-data); needs --key-file (default: none, the key alone authenticates the listener)")
	fs.StringVar(&o.layers, "layers", "", "let dialers ask only for the layers in the comma-separated `LIST` (default: every registered filter)")
	fs.Var(&o.limits, "limit", "narrow a layer parameter's bounds, written `LAYER.PARAM=MIN-MAX` or LAYER.PARAM=VALUE: the server runs the mirrored layer too, so a high compression level costs it CPU (repeatable; default: the layer's own bounds)")
	fs.StringVar(&o.plain, "plain", "default", "what to do with plain connections (no hello), `MODE`: default (accept them unless --key-file is given), allow or refuse; without --target they are always refused")
	fs.DurationVar(&o.handshakeTimeout, "handshake-timeout", vlink.DefaultHandshakeTimeout, "close a connection whose handshake, target dial included, takes longer than `DURATION`, unless its dialer waits longer for the target (--max-dial-timeout)")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 10*time.Second, "give up dialing the target after `DURATION`, unless the dialer waits longer (--max-dial-timeout)")
	fs.DurationVar(&o.maxDialTimeout, "max-dial-timeout", 130*time.Second, "let a dialer that waits longer than --dial-timeout for its target have the dial take up to `DURATION`, as vlink exec does so that a program's own connect timeout (or the kernel's, about 2 minutes) decides, as without vlink; the dial stops when the dialer hangs up (0: never past --dial-timeout)")
	fs.BoolVar(&o.quic, "quic", false, "also accept QUIC (reliable UDP) on --listen's UDP port: for lossy, long paths (vlink tunnel --stack zstd+quic; with --key-file the stack needs a filter above quic to carry the key: --stack quic alone sends no hello); dialers check the listener by the key, or by the pin it logs")
	fs.StringVar(&o.quicCert, "quic-cert", "", "with --quic: a `FILE` keeping the QUIC certificate and key, made (mode 600) if missing, so the pin dialers may hold survives restarts")
	fs.BoolVar(&o.shm, "shm", false, "also accept connections over shared memory from this machine's processes of the same user, on --listen's port number (vlink tunnel --stack lz4+shm; with --key-file the stack needs a filter above shm to carry the key: --stack shm alone sends no hello; Linux)")
	fs.StringVar(&o.listenStack, "listen-stack", "", "accept on --listen through the top factory of `STACK` instead of on this host: with ssh:host=bastion the SSH server listens on its side, as ssh -R does (default: this host)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", defaultIdleTimeout, "reset a plain connection (no hello) that carried no byte either way for `DURATION`, so forgotten or hostile idle clients do not pile up; 0: never. An hour spares interactive sessions left open over lunch; a client that sends keepalives (ssh -o ServerAliveInterval) is never idle")
	fs.BoolVar(&o.eventLoop, "event-loop", true, "without --key-file, --quic, --shm or --listen-stack: take the hellos that need no more than the policy's checks (a tcp route's, vlink exec's) to a target given as an IP address on one goroutine with epoll, which answers, dials and relays them as the tunnel's event loop does, at about half the CPU and latency of a goroutine's; every other connection goes the usual way. false: a goroutine per connection (Linux only)")
	fs.BoolVar(&o.insecurePlaintext, "insecure-plaintext", false, "UNSAFE: with --key-file, also accept VLink dialers beyond loopback whose stack has no encryption layer (noise); by default they are refused, since vlink dialers holding the key add it. Only for a network you trust")
	base.NodeFlags(fs, &o.node, "so that other nodes reach the targets --allow lets them name (NAME.vlink.alt:PORT is localhost:PORT here) through the relay, with no port open to them")
	base.RulesFlag(fs, &o.node)
}

// Defaults of the flags.
const (
	defaultIdleTimeout = time.Hour
	// As a NAT's UDP mappings: RFC 4787 asks at least 2 minutes.
	defaultUDPIdleTimeout = 2 * time.Minute
	defaultUDPSessions    = 1024
)

// server is a running "vlink serve".
type server struct {
	target      string
	hop         *vlink.Dialer      // reaches next nodes; nil: --hop not given
	proxy       *selector.Selector // targets that get a PROXY v2 header
	dialTimeout time.Duration
	idleTimeout time.Duration // plain relays only
	udpIdle     time.Duration
	udpSlots    chan struct{} // one per datagram session relayed
	udpClients  clientCount   // the sessions of each client address
	log         *slog.Logger
	t           *forward.Tracker
	forward     string // the metrics' forward label: base.Env.ForwardName
}

// serveForward is a "vlink serve" forward whose flags passed every check,
// not yet listening.
type serveForward struct {
	o           *serveOptions
	policy      vlink.Policy
	listenStack vlink.Stack
	s           server // log and t are set by start
}

func (o *serveOptions) prepare(e *base.Env) (forward.Forward, error) {
	if o.target == "" && len(o.allow) == 0 && len(o.hops) == 0 && len(o.allowUDP) == 0 {
		return nil, base.Usagef("nothing to forward to: add --target HOST:PORT (where connections go), " +
			"--allow PATTERN (the targets VLink dialers may name), --allow-udp PATTERN (where they may send datagrams) or --hop PATTERN (the nodes they may route through); serve never runs as an open proxy")
	}
	if o.udpSessions <= 0 || o.udpPerClient <= 0 {
		return nil, base.Usagef("--udp-sessions %d, --udp-sessions-per-client %d: want at least 1", o.udpSessions, o.udpPerClient)
	}
	policy, err := o.policy()
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"handshake-timeout", o.handshakeTimeout}, {"dial-timeout", o.dialTimeout}, {"idle-timeout", o.idleTimeout}, {"udp-idle-timeout", o.udpIdleTimeout},
		{"max-dial-timeout", o.maxDialTimeout}} {
		if d.v < 0 || (d.v == 0 && d.name != "idle-timeout" && d.name != "max-dial-timeout") {
			return nil, base.Usagef("--%s %v: want a positive duration", d.name, d.v)
		}
	}
	if o.keyFile != "" {
		if policy.Key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
			return nil, err
		}
	}
	if o.identityFile != "" {
		if o.keyFile == "" {
			return nil, base.Usagef("--identity needs --key-file: the identity is proven inside the encryption, which the key sets up")
		}
		if policy.Identity, err = vlink.ReadIdentityFile(o.identityFile); err != nil {
			return nil, err
		}
	}
	policy.RefuseEarlyData = o.refuseEarly
	f := &serveForward{o: o, policy: policy,
		s: server{target: o.target, dialTimeout: o.dialTimeout, idleTimeout: o.idleTimeout,
			udpIdle: o.udpIdleTimeout, udpSlots: make(chan struct{}, o.udpSessions),
			udpClients: clientCount{max: o.udpPerClient, n: map[string]int{}}}}
	if len(o.hops) > 0 {
		hs, err := vlink.Parse(o.hopStack)
		if err != nil {
			return nil, base.Usagef("--hop-stack: %v", err)
		}
		if !hs.IsPlain() {
			return nil, base.Usagef("--hop-stack %s: give factories only; the layers a dialer asks for run end to end, not between nodes", secret.RedactStack(o.hopStack))
		}
		f.s.hop = &vlink.Dialer{Stack: hs, Timeout: o.dialTimeout}
	} else if o.hopStack != "tcp" {
		return nil, base.Usagef("--hop-stack needs --hop: it says how to reach the next nodes --hop lets dialers name")
	}
	if len(o.proxyProtocol) > 0 {
		var rules []selector.Rule
		for _, a := range o.proxyProtocol {
			r, err := parseAllow(a)
			if err != nil {
				return nil, base.Usagef("--proxy-protocol: %v", err)
			}
			rules = append(rules, r)
		}
		if f.s.proxy, err = selector.New(rules, selector.Rule{Action: selector.Refuse}); err != nil {
			return nil, base.Usagef("--proxy-protocol: %v", err)
		}
	}
	base.WarnPassword(e, "--hop-stack", o.hopStack)
	base.WarnPassword(e, "--listen-stack", o.listenStack)
	if o.shm && o.listenStack != "" {
		return nil, base.Usagef("--shm listens beside this host's port; with --listen-stack there is none")
	}
	if o.quic && o.listenStack != "" {
		return nil, base.Usagef("--quic listens beside this host's port; with --listen-stack there is none (--listen-stack quic takes QUIC only)")
	}
	if o.quicCert != "" && !o.quic {
		return nil, base.Usagef("--quic-cert is the certificate of --quic; give --quic too")
	}
	if o.listenStack != "" {
		if f.listenStack, err = vlink.Parse(o.listenStack); err != nil {
			return nil, base.Usagef("--listen-stack: %v", err)
		}
	}
	return f, nil
}

func (f *serveForward) ListenAddr() string { return f.o.listen }

func (f *serveForward) Inputs() [][]byte {
	return [][]byte{f.policy.Key, f.policy.Identity, f.o.node.KeyFileContent()}
}

func (f *serveForward) Start(ctx context.Context, e *base.Env, t *forward.Tracker) (net.Listener, func(net.Conn), func(), error) {
	o, policy, s := f.o, f.policy, &f.s
	s.log, s.t, s.forward = e.Log, t, e.ForwardName(f.ListenAddr())
	lc := vlink.ListenConfig{
		Stack:            f.listenStack,
		Shm:              o.shm,
		Quic:             o.quic,
		QuicCert:         o.quicCert,
		Policy:           policy,
		HandshakeTimeout: o.handshakeTimeout,
		MaxTargetWait:    o.maxDialTimeout,
		Admit:            s.admit,
		Lookup:           s.lookup,
		Logger:           e.Log,
		Observe:          t.Metrics.Handshook,
		// Each connection is served on its handshake's goroutine: no
		// hand-off through Accept and a goroutine of its own.
		Handle: func(c *vlink.Conn) {
			if !t.Run(func() { s.handle(c) }) {
				netconn.Abort(c) // shutting down: a reset, never a clean empty stream
				if a, ok := c.Admitted().(io.Closer); ok {
					a.Close()
				}
			}
		},
	}
	vl, lp, err := f.listen(ctx, e, &lc)
	if err != nil {
		return nil, nil, nil, err
	}
	var l net.Listener = vl
	stopLoop := func() {}
	if lp != nil {
		stopCut := t.CutLoop(lp)
		stopLoop = func() { stopCut() }
	}
	if ta, ok := l.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && policy.Key == nil {
		e.Log.Warn("listening beyond loopback without --key-file: anyone who can reach this port can use what it forwards to",
			"addr", l.Addr().String())
	}
	if o.shm {
		e.Log.Info("serving on shared memory too", "addr", net.JoinHostPort("127.0.0.1", portOf(l.Addr())))
	}
	identity := "none"
	if policy.Identity != nil {
		pub, _ := vlink.IdentityPublic(policy.Identity)
		identity = knownnodes.Fingerprint(pub)
	}
	e.Log.Info("serving", "addr", l.Addr().String(), "target", o.target, "allow", strings.Join(o.allow, " "), "allow_udp", strings.Join(o.allowUDP, " "),
		"layers", strings.Join(policy.Layers, ","), "plain", policyPlain(policy), "auth", policy.Key != nil, "identity", identity, "event_loop", lp != nil)
	// The listener retries its own temporary accept failures, and
	// accepts only *vlink.Conn.
	handle := func(c net.Conn) { s.handle(c.(*vlink.Conn)) }
	if !o.node.Given() {
		return l, handle, stopLoop, nil
	}
	// Other nodes' connections come through the network: the same
	// policy, with the key the relay gives each connection, or, for a
	// member (--cert), the certificates of the two nodes.
	node, err := o.node.Connect(ctx, e, policy.Key)
	if err != nil {
		l.Close()
		return nil, nil, nil, err
	}
	nl, err := node.Listen(func(from string, port uint16) error {
		// Streams or datagrams: the hello says which, and the listener
		// checks it against the right list.
		target := net.JoinHostPort("localhost", strconv.Itoa(int(port)))
		err := policy.AllowsTarget(target)
		if err != nil && policy.AllowsDatagrams(target) == nil {
			return nil
		}
		return err
	})
	if m := o.node.Member(); m != nil {
		// Other members prove their certificates end to end; the key
		// the relay hands out is refused.
		lc.Policy.Member = m
	}
	if err == nil {
		var vl net.Listener
		if vl, err = lc.NewListener(nl); err != nil {
			nl.Close()
		} else {
			e.Log.Info("serving as a node", "node", node.Name(), "addr", node.Name()+vlink.NodeSuffix, "seen as", node.Observed().String())
			return netconn.Merge(l, vl), handle, func() { stopLoop(); node.Close() }, nil
		}
	}
	l.Close()
	stopLoop()
	node.Close()
	return nil, nil, nil, err
}

// policy builds the listener's policy from the flags.
func (o *serveOptions) policy() (vlink.Policy, error) {
	p := vlink.Policy{InsecurePlaintext: o.insecurePlaintext}
	if o.target != "" {
		if err := base.CheckHostPort(o.target); err != nil {
			return p, base.Usagef("--target %s", err)
		}
	}
	for _, a := range o.allow {
		r, err := parseAllow(a)
		if err != nil {
			return p, err
		}
		p.Targets = append(p.Targets, r)
	}
	for _, a := range o.allowUDP {
		r, err := parseAllow(a)
		if err != nil {
			return p, base.Usagef("--allow-udp: %v", err)
		}
		p.Datagrams = append(p.Datagrams, r)
	}
	for _, a := range o.hops {
		r, err := parseAllow(a)
		if err != nil {
			return p, base.Usagef("--hop: %v", err)
		}
		p.Hops = append(p.Hops, r)
	}
	if o.layers != "" {
		var err error
		if p.Layers, err = base.ParseLayerList("--layers", o.layers); err != nil {
			return p, err
		}
	}
	for _, l := range o.limits {
		key, r, err := parseLimit(l)
		if err != nil {
			return p, err
		}
		if p.Limits == nil {
			p.Limits = map[string]vlink.Range{}
		}
		p.Limits[key] = r
	}
	switch o.plain {
	case "default":
		p.Plain = vlink.PlainDefault
	case "allow":
		p.Plain = vlink.PlainAllow
	case "refuse":
		p.Plain = vlink.PlainRefuse
	default:
		return p, base.Usagef("--plain %q: want default, allow or refuse", o.plain)
	}
	if o.target == "" {
		if p.Plain == vlink.PlainAllow {
			return p, base.Usagef("--plain allow needs --target: plain connections name no target")
		}
		p.Plain = vlink.PlainRefuse
	}
	if err := p.Validate(); err != nil {
		return p, base.Usagef("%v", err)
	}
	return p, nil
}

func policyPlain(p vlink.Policy) string {
	switch {
	case p.Plain == vlink.PlainRefuse, p.Plain == vlink.PlainDefault && p.Key != nil:
		return "refused"
	}
	return "accepted"
}

// parseAllow parses an --allow pattern, HOST:PORTS.
func parseAllow(s string) (selector.Rule, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return selector.Rule{}, base.Usagef("--allow %q: want HOST:PORTS, e.g. *.corp.example:443, 10.0.0.0/8:1-65535 or [fd00::1]:* (* is any port)", s)
	}
	r := selector.Rule{Host: s[:i], Ports: s[i+1:], Action: selector.Direct}
	if err := r.Validate(); err != nil {
		return r, base.Usagef("--allow %q: %v", s, err)
	}
	return r, nil
}

// parseLimit parses a --limit, LAYER.PARAM=MIN-MAX or LAYER.PARAM=VALUE.
func parseLimit(s string) (string, vlink.Range, error) {
	var r vlink.Range
	bad := func(why string) (string, vlink.Range, error) {
		return "", r, base.Usagef("--limit %q: %s", s, why)
	}
	key, val, ok := strings.Cut(s, "=")
	name, param, ok2 := strings.Cut(key, ".")
	if !ok || !ok2 || val == "" {
		return bad("want LAYER.PARAM=MIN-MAX, e.g. zstd.level=1-9")
	}
	spec, found := layer.Lookup(name)
	if !found {
		return bad(fmt.Sprintf("no layer %q (see vlink layers)", name))
	}
	p, found := spec.Param(param)
	if !found {
		return bad(fmt.Sprintf("layer %s has no parameter %q (see vlink layers)", name, param))
	}
	if p.Type != layer.TypeInt && p.Type != layer.TypeDuration && p.Type != layer.TypeSize {
		return bad(fmt.Sprintf("only int, duration and size parameters can be limited, not %s", p.Type))
	}
	lo, hi, isRange := strings.Cut(val, "-")
	if !isRange {
		hi = lo
	}
	var err error
	if r.Min, err = p.Value(lo); err != nil {
		return bad(err.Error())
	}
	if r.Max, err = p.Value(hi); err != nil {
		return bad(err.Error())
	}
	if r.Min > r.Max {
		return bad("the range is backwards")
	}
	return key, r, nil
}

// admit runs for each VLink connection the policy accepted, before the
// dialer is answered: it dials the target, so an unreachable target is
// reported to the dialer rather than seen as a connection that closes.
func (s *server) admit(ctx context.Context, h *vlink.Hello) (any, error) {
	if len(h.Hops) > 0 {
		return s.admitHop(ctx, h)
	}
	if h.Datagram {
		return s.admitDatagrams(ctx, h)
	}
	to := h.Target
	if to == "" {
		if s.target == "" {
			return nil, &vlink.RefusedError{Code: vlink.CodeTarget,
				Reason: "this server has no default target; name one (vlink tunnel --via)"}
		}
		to = s.target
	}
	// A dialer that waits longer (a program's connect under vlink exec)
	// has it, as far as the listener's MaxTargetWait let ctx run.
	c, err := dialTarget(ctx, &net.Dialer{Timeout: max(s.dialTimeout, h.TargetWait)}, to)
	if errors.Is(ctx.Err(), context.Canceled) && err != nil {
		// The dialer hung up (or serve is stopping): nobody to tell.
		s.log.Info("the dialer left before the target answered", "remote", h.RemoteAddr.String(), "target", to)
		return nil, err
	}
	if err != nil {
		s.log.Warn("target unreachable", "remote", h.RemoteAddr.String(), "target", to, "err", err)
		return nil, vlink.TargetRefusal(err)
	}
	if err := s.sendProxyHeader(c, to, h.RemoteAddr); err != nil {
		c.Close()
		return nil, &vlink.RefusedError{Code: vlink.CodeUnreachable, Reason: "sending the PROXY header: " + err.Error()}
	}
	return s.track(c)
}

// admitDatagrams takes a slot for a datagram session and opens its UDP
// socket, connected to the target, so that ICMP errors come back to it.
func (s *server) admitDatagrams(ctx context.Context, h *vlink.Hello) (any, error) {
	client := clientOf(h)
	if !s.udpClients.add(client) {
		return nil, &vlink.RefusedError{Code: vlink.CodeBusy, Reason: fmt.Sprintf("relaying %d datagram sessions for %s already (vlink serve --udp-sessions-per-client)", s.udpClients.max, client)}
	}
	select {
	case s.udpSlots <- struct{}{}:
	default:
		s.udpClients.remove(client)
		return nil, &vlink.RefusedError{Code: vlink.CodeBusy, Reason: fmt.Sprintf("relaying %d datagram sessions already (vlink serve --udp-sessions)", cap(s.udpSlots))}
	}
	release := func() {
		<-s.udpSlots
		s.udpClients.remove(client)
	}
	to := h.Target
	if host, port, err := net.SplitHostPort(to); err == nil && isLocalhost(host) {
		to = net.JoinHostPort("127.0.0.1", port)
	}
	u, err := (&net.Dialer{Timeout: s.dialTimeout}).DialContext(ctx, "udp", to)
	if err != nil {
		release()
		s.log.Warn("datagram target unreachable", "remote", h.RemoteAddr.String(), "target", h.Target, "err", err)
		return nil, vlink.TargetRefusal(err)
	}
	netconn.SetUDPBuffers(u.(*net.UDPConn), dgram.SocketBuffer/4) // one client's, not a listener's
	a, err := s.track(u)
	if err != nil {
		release()
		return nil, err
	}
	a.(*admitted).slot = release
	return a, nil
}

// clientOf names the client a datagram session counts against: the node
// that proved its name, or the origin's IP address.
func clientOf(h *vlink.Hello) string {
	if h.Node != "" {
		return "node " + h.Node
	}
	if ap, err := netip.ParseAddrPort(h.RemoteAddr.String()); err == nil {
		return ap.Addr().Unmap().String()
	}
	return h.RemoteAddr.String()
}

// clientCount counts what each client holds, up to max.
type clientCount struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

func (c *clientCount) add(a string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[a] >= c.max {
		return false
	}
	c.n[a]++
	return true
}

func (c *clientCount) remove(a string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[a]--; c.n[a] <= 0 {
		delete(c.n, a)
	}
}

// lookup answers a dialer that asks whether a target it may reach
// resolves here (vlink exec's programs resolving a name the gateway
// knows): the resolver this server dials with, so the answer is what a
// connection would find.
func (s *server) lookup(ctx context.Context, h *vlink.Hello) (vlink.Families, error) {
	if len(h.Hops) > 0 {
		return 0, errors.New("lookups are answered where routes end")
	}
	host, _, err := net.SplitHostPort(h.Target)
	if err != nil {
		return 0, err
	}
	return vlink.LookupFamilies(ctx, nil, host)
}

// admitHop carries a routed connection on to the next node, before the
// dialer is answered, so a refusal further on comes back to it.
func (s *server) admitHop(ctx context.Context, h *vlink.Hello) (any, error) {
	c, err := h.DialNextHop(ctx, s.hop)
	if err != nil {
		s.log.Warn("next node refused or unreachable", "origin", h.RemoteAddr.String(), "next", h.Hops[0], "err", err)
		var re *vlink.RefusedError
		if errors.As(err, &re) {
			return nil, re
		}
		return nil, &vlink.RefusedError{Code: vlink.CodeUnreachable, Reason: fmt.Sprintf("cannot reach the next node, %s: %v", h.Hops[0], err)}
	}
	return s.track(c)
}

// track hands the tracker a connection dialed for a dialer being
// admitted: should the listener close before handing the connection
// over, shutdown still closes it.
func (s *server) track(c net.Conn) (any, error) {
	if !s.t.Add(c) {
		c.Close()
		return nil, &vlink.RefusedError{Code: vlink.CodeBusy, Reason: "shutting down"}
	}
	return &admitted{Conn: c, t: s.t}, nil
}

// sendProxyHeader sends c a PROXY v2 header naming origin when target
// matches --proxy-protocol.
func (s *server) sendProxyHeader(c net.Conn, target string, origin net.Addr) error {
	if s.proxy == nil {
		return nil
	}
	if r, err := s.proxy.Match(target); err != nil || r.Action == selector.Refuse {
		return nil
	}
	src, ok1 := origin.(*net.TCPAddr)
	dst, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return fmt.Errorf("addresses %v -> %v are not TCP", origin, c.RemoteAddr())
	}
	c.SetWriteDeadline(time.Now().Add(s.dialTimeout))
	defer c.SetWriteDeadline(time.Time{})
	_, err := c.Write(proxyproto.Header(src.AddrPort(), dst.AddrPort()))
	return err
}

// admitted is a target connection dialed by admit. The listener closes it
// if the handshake fails after all; that also forgets it.
type admitted struct {
	net.Conn
	t    *forward.Tracker
	slot func() // gives back a datagram session's place, once
	once sync.Once
}

func (a *admitted) Close() error {
	a.release()
	a.t.Remove(a.Conn)
	return a.Conn.Close()
}

// release gives back the datagram session's slot.
func (a *admitted) release() {
	a.once.Do(func() {
		if a.slot != nil {
			a.slot()
		}
	})
}

// handle forwards one accepted connection.
func (s *server) handle(c *vlink.Conn) {
	attrs := []any{"remote", c.RemoteAddr().String()}
	h := c.Hello()
	if h == nil {
		attrs = append(attrs, "stack", "plain", "target", s.target)
		tc, err := dialTarget(s.t.Ctx, &net.Dialer{Timeout: s.dialTimeout}, s.target)
		if err == nil {
			if err = s.sendProxyHeader(tc, s.target, c.RemoteAddr()); err != nil {
				tc.Close()
			}
		}
		if err != nil {
			netconn.Abort(c) // a reset, never a clean empty stream
			if !errors.Is(err, context.Canceled) {
				s.log.Warn("target unreachable: plain connection closed", append(attrs, "err", err)...)
			}
			return
		}
		s.log.Debug("forwarding", attrs...)
		s.t.RelayIdle(s.log, s.idleTimeout, metrics.Labels{Forward: s.forward, Stack: "plain", Transport: metrics.Transport(c)}, c, tc, attrs...)
		return
	}
	labels := metrics.Labels{Forward: s.forward, Stack: metrics.HelloStackLabel(h), Transport: metrics.Transport(c)}
	to := h.Target
	if to == "" {
		to = s.target
	}
	switch {
	case len(h.Hops) > 0:
		// Nothing is mirrored or targeted here: the bytes go on to the
		// next node. Every node of a route logs where the connection
		// came from, as the nodes before it vouched for it.
		labels.Stack = "route" // the layers run end to end, unread here
		attrs = []any{"origin", h.RemoteAddr.String(), "from", c.RemoteAddr().String(), "forwarded", h.Forwarded,
			"next", h.Hops[0], "then", strings.Join(h.Hops[1:], ","), "authenticated", h.Authenticated}
		s.log.Info("forwarding a routed connection to the next node", attrs...)
	case h.Forwarded > 0:
		attrs = []any{"origin", h.RemoteAddr.String(), "from", c.RemoteAddr().String(), "forwarded", h.Forwarded,
			"stack", h.Stack.String(), "target", to, "authenticated", h.Authenticated}
		s.log.Info("forwarding a routed connection to its target", attrs...)
	default:
		attrs = append(attrs, "stack", h.Stack.String(), "target", to, "authenticated", h.Authenticated)
	}
	a, ok := c.Admitted().(*admitted)
	if !ok { // cannot happen: admit returns a connection or an error
		c.Close()
		return
	}
	tc := a.Conn // unwrapped, so that relaying TCP to TCP takes the zero-copy path
	if h.Datagram {
		defer a.release()
		attrs = append(attrs, "udp", true, "quic_datagrams", h.QUICDatagrams)
		s.log.Debug("relaying datagrams", attrs...)
		s.t.RelayDatagrams(s.log, s.udpIdle, labels, vlink.DatagramConn(c, nil), tc, attrs...)
		return
	}
	s.log.Debug("forwarding", attrs...)
	s.t.Relay(s.log, labels, c, tc, attrs...)
}

// portOf returns the port of a listener's address.
func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}

// dialTarget dials a target. "localhost" is this host's loopback in
// both families, whatever /etc/hosts says (RFC 6761): a service bound to
// ::1 only is reached as one bound to 127.0.0.1 is, IPv4 first.
func dialTarget(ctx context.Context, d *net.Dialer, target string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil || !isLocalhost(host) {
		return d.DialContext(ctx, "tcp", target)
	}
	c, err4 := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", port))
	if err4 == nil || ctx.Err() != nil {
		return c, err4
	}
	c, err6 := d.DialContext(ctx, "tcp", net.JoinHostPort("::1", port))
	if err6 == nil {
		return c, nil
	}
	if errors.Is(err6, syscall.EADDRNOTAVAIL) || errors.Is(err6, syscall.EAFNOSUPPORT) {
		return nil, err4 // no IPv6 loopback here: the IPv4 error says it all
	}
	return nil, fmt.Errorf("%w; %w", err4, err6)
}

// isLocalhost reports whether host names the loopback by name: localhost
// or a name under .localhost.
func isLocalhost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

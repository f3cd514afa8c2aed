// Package dial holds vlink's dialing commands: "vlink tunnel" carries
// local TCP connections through a stack, "vlink connect" carries
// standard input and output (an ssh ProxyCommand), and "vlink socks"
// runs a SOCKS server whose connections follow stacks.
package dial

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/forward"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/netconn/evloop"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

var TunnelCmd = &cli.Command{
	Name:     "tunnel",
	Summary:  "carry local TCP connections (or UDP datagrams) through a stack to a VLink server",
	Synopsis: "(--to HOST:PORT [--stack STACK] [--via HOST:PORT] | --forwards FILE) [flags]",
	About: `
Listens on a local port (plain TCP, for any program) and carries each
connection it accepts through a stack to --to:

  - without --via, --to is a VLink listener ("vlink serve", or a program
    listening with the vlink library) that mirrors the stack and forwards
    the connection to its own --target;
  - with --via, the VLink gateway --via mirrors the stack and forwards the
    connection to the plain server --to (its --allow must match --to);
  - with a plain stack (--stack tcp) and no --via, --to is any TCP server.

With --udp it listens on the UDP port instead, and carries each client's
datagrams, whole, through the stack to the gateway --via, which sends
them to --to as UDP (its --allow-udp must match --to) and returns the
answers: one session per client address, ended when idle, as a NAT's.

Without --stack, the user's configuration decides per destination: the file
named by VLINK_CONFIG (default ~/.config/vlink/config.toml), VLINK_STACK,
VLINK_VIA and VLINK_KEY_FILE; with none of them, plain TCP.

A stack is written from the application side down, layers joined by '+',
parameters after ':' (zstd:level=3+tcp); tcp is implied at the bottom.
"vlink layers" lists the layers and their parameters. Connections are
logged at debug, failures (a refusal and its reason, an unreachable
server) at info.

With --forwards FILE, one process runs many tunnels, as ssh -L -L or frp's
proxy list do: FILE is TOML, one [[forward]] table per tunnel, whose keys
are the flags of one tunnel without their dashes, and name = "..." to name
it in the log. SIGHUP rereads the file (see --forwards); without
--forwards it is logged and ignored. The example unit
docs/systemd/vlink@.service runs it under systemd.
`,
	Examples: `
  # With the first "vlink serve" example running: local port 8080 reaches
  # the server's target, compressed with zstd over the wire:
  vlink tunnel --listen 127.0.0.1:8080 --to 127.0.0.1:7000 --stack zstd

  # Through the gateway 127.0.0.1:7000 to 10.1.2.3:443, which the
  # gateway's --allow must match:
  vlink tunnel --listen 127.0.0.1:8443 --via 127.0.0.1:7000 --to 10.1.2.3:443 --stack lz4

  # Through an SSH bastion (ssh -L): the bastion connects to db.internal:
  vlink tunnel --listen 127.0.0.1:5432 --to db.internal:5432 --stack ssh:host=bastion.example

  # DNS through the gateway (vlink serve --allow-udp 10.1.2.53:53):
  # dig @127.0.0.1 -p 5353 example.org asks 10.1.2.53
  vlink tunnel --udp --listen 127.0.0.1:5353 --via 127.0.0.1:7000 --to 10.1.2.53:53 --stack lz4

  # Publish the local port 8000 on the bastion's port 8080 (ssh -R):
  vlink tunnel --listen-stack ssh:host=bastion.example --listen 127.0.0.1:8080 \
      --to 127.0.0.1:8000 --stack tcp

  # Two tunnels in one process; after editing the file, kill -HUP reloads it:
  cat > tunnels.toml <<'EOF'
  [[forward]]
  name = "db"
  listen = "127.0.0.1:5432"
  to = "db.internal:5432"
  stack = "ssh:host=bastion.example"

  [[forward]]
  listen = "127.0.0.1:8443"
  via = "127.0.0.1:7000"
  to = "10.1.2.3:443"
  stack = "lz4"
  key_file = "vlink.key"   # relative to the file's folder
  EOF
  vlink tunnel --forwards tunnels.toml
`,
	Flags: base.WithEnv(tunnelFlags),
}

type tunnelOptions struct {
	dialOptions
	listen, listenStack string
	udp                 bool
	udpIdleTimeout      time.Duration
	udpSessions         int
	earlyWait           time.Duration
	eventLoop           bool
}

// dialOptions are what the commands reaching one destination through a
// stack (tunnel, connect) share: the destination, the stack and how to
// trust and reach the far side.
type dialOptions struct {
	to                  string
	toName              string // what the user calls to in messages: "--to", "HOST:PORT"
	stack, via, keyFile string
	knownNodes          string
	dialTimeout         time.Duration
	insecurePlaintext   bool
	node                base.NodeOptions
}

func tunnelFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	p := &forward.ProcessOptions{}
	p.Flags(fs)
	o := &tunnelOptions{}
	o.flags(fs)
	return func(ctx context.Context, e *base.Env) int {
		if err := p.Run(ctx, e, fs, o.prepare, func(fs *flag.FlagSet) func(*base.Env) (forward.Forward, error) {
			o := &tunnelOptions{}
			o.flags(fs)
			return o.prepare
		}); err != nil {
			return base.Fail(e, "vlink tunnel", err)
		}
		return base.ExitOK
	}
}

// flags defines the flags of one forward: those a --forwards file's
// entries take.
func (o *tunnelOptions) flags(fs *flag.FlagSet) {
	o.toName = "--to"
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "accept local connections on `ADDR` (host:port)")
	fs.StringVar(&o.to, "to", "", "carry connections to `HOST:PORT`: a VLink listener, or with --via the plain destination (required)")
	fs.StringVar(&o.stack, "stack", "", "carry connections through `STACK`, e.g. zstd, lz4+tcp or zstd+socks5h://proxy:1080; a filter (identity, zstd, ...) marks the end, so a stream cut short is an error, where tcp alone, byte for byte, ends as TCP does (default: the user's configuration decides)")
	fs.StringVar(&o.via, "via", "", "go through the VLink gateway at `HOST:PORT` (vlink serve --allow), which forwards to --to; or through a chain of nodes, HOST:PORT,HOST:PORT,...: the first is reached first and forwards to the next (vlink serve --hop), the last is the gateway. Needs --stack (default: none)")
	fs.StringVar(&o.keyFile, "key-file", "", "prove to the server that we hold the pre-shared key in `FILE`; needs --stack (default: none, or the configuration's)")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 10*time.Second, "give up reaching --to, handshake included, after `DURATION`")
	fs.StringVar(&o.listenStack, "listen-stack", "", "accept on --listen through the top factory of `STACK` instead of on this host: with ssh:host=bastion the SSH server listens on its side, as ssh -R does (default: this host)")
	fs.BoolVar(&o.udp, "udp", false, "carry UDP instead: listen on --listen's UDP port and carry each client's datagrams whole through --stack to the gateway --via, which sends them to --to as UDP (vlink serve --allow-udp) and returns the answers; one session per client address. Over a stack whose bottom is quic (serve --quic), those that fit a packet ride QUIC datagrams, unreliable as UDP. Without --via and with a plain stack, datagrams go straight to --to")
	fs.DurationVar(&o.earlyWait, "early-wait", 2*time.Millisecond, "when the gateway takes early data (vlink serve --identity), wait up to `DURATION` for a new client's first bytes and send them with the hello: a request then costs two round trips to its answer, as over TCP, instead of three. A server that speaks first (SMTP, MySQL) pays the wait; 0 turns it off")
	fs.BoolVar(&o.eventLoop, "event-loop", true, "to an IP address with a tcp stack alone (its parameters but ports and local), or without --stack where the configuration's route to --to is direct, serve connections on one goroutine with epoll, as HAProxy does on one thread: a short connection then costs about half the CPU and latency of a goroutine's; those that carry bulk data move to the splicing relay. false: a goroutine per connection (Linux only)")
	fs.DurationVar(&o.udpIdleTimeout, "udp-idle-timeout", 2*time.Minute, "with --udp: end a client's session after `DURATION` without a datagram either way, as a NAT forgets a mapping")
	fs.IntVar(&o.udpSessions, "udp-sessions", dgram.DefaultMaxSessions, "with --udp: carry at most `N` clients at once; a new one takes the place of the oldest that never got an answer, else its datagrams are dropped, as is a datagram that finds its client's queue full (256 datagrams, 8 MiB in all)")
	base.InsecurePlaintextVar(fs, &o.insecurePlaintext)
	base.KnownNodesVar(fs, &o.knownNodes)
	base.NodeFlags(fs, &o.node, "to reach --to NODE.vlink.alt:PORT, another node's port, through the relay")
	base.ReverseFlag(fs, &o.node)
}

// dialer builds the Dialer the flags describe.
func (o *dialOptions) dialer() (*vlink.Dialer, error) {
	if err := base.CheckHostPort(o.to); err != nil {
		return nil, base.Usagef("%s %v", o.toName, err)
	}
	if o.dialTimeout <= 0 {
		return nil, base.Usagef("--dial-timeout wants a positive duration")
	}
	if _, _, isNode := vlink.SplitNodeAddr(o.to); isNode && !o.node.Given() {
		return nil, base.Usagef("%s %s names a node of a vlink network: join it with --node NAME --relay HOST:PORT (and --node-key-file)", o.toName, o.to)
	}
	d := &vlink.Dialer{Timeout: o.dialTimeout, InsecurePlaintext: o.insecurePlaintext}
	if o.stack == "" {
		if o.via != "" || o.keyFile != "" {
			return nil, base.Usagef("--via and --key-file need --stack (--stack tcp for no filter); without --stack the configuration decides")
		}
		// Read now, so that a broken configuration stops the tunnel
		// instead of failing every connection; read afresh, not the
		// process's cached DefaultConfig, so that a forward a reload
		// starts follows the configuration as it is then.
		cfg, err := vlink.ConfigFromEnv()
		if err != nil {
			return nil, err
		}
		d.Config = cfg
		return d, nil
	}
	s, err := vlink.Parse(o.stack)
	if err != nil {
		return nil, base.Usagef("--stack: %v", err)
	}
	if o.via != "" {
		if s, d.Via, err = viaChain(s, o.via); err != nil {
			return nil, err
		}
	}
	d.Stack = s
	if o.keyFile != "" {
		if err := base.CheckKeyCarried(o.stack, s, o.via, &o.node); err != nil {
			return nil, err
		}
		if d.Key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// tunnelForward is a "vlink tunnel" forward whose flags passed every
// check, not yet listening.
type tunnelForward struct {
	o     *tunnelOptions
	d     *vlink.Dialer
	label string // the metrics' name for the stack: metrics.StackLabel, or config
}

func (o *tunnelOptions) prepare(e *base.Env) (forward.Forward, error) {
	if o.to == "" {
		return nil, base.Usagef("--to HOST:PORT is required: where connections go")
	}
	d, err := o.dialer()
	if err != nil {
		return nil, err
	}
	if o.listenStack != "" {
		if _, err := vlink.Parse(o.listenStack); err != nil {
			return nil, base.Usagef("--listen-stack: %v", err)
		}
	}
	if o.udp {
		switch {
		case o.listenStack != "":
			return nil, base.Usagef("--udp listens on this host's UDP port; --listen-stack takes streams only")
		case o.stack != "" && d.Via == "" && !d.Stack.IsPlain() && !isNode(o.to):
			return nil, base.Usagef("--udp --stack %s needs --via: a gateway (vlink serve --allow-udp) relays the datagrams to --to as UDP", secret.RedactStack(o.stack))
		case o.udpSessions <= 0:
			return nil, base.Usagef("--udp-sessions %d: want at least 1", o.udpSessions)
		case o.udpIdleTimeout <= 0:
			return nil, base.Usagef("--udp-idle-timeout %v: want a positive duration", o.udpIdleTimeout)
		}
	}
	base.WarnPassword(e, "--stack", o.stack)
	base.WarnPassword(e, "--listen-stack", o.listenStack)
	base.SetPins(o.knownNodes, e.Log, &d.PeerKey, &d.PinnedKey)
	label := "config"
	if o.stack != "" {
		label = metrics.StackLabel(d.Stack)
	}
	return &tunnelForward{o: o, d: d, label: label}, nil
}

func (f *tunnelForward) ListenAddr() string {
	if f.o.udp {
		return "udp " + f.o.listen // beside a TCP forward on the same port
	}
	return f.o.listen
}

func (f *tunnelForward) Inputs() [][]byte {
	in := [][]byte{f.d.Key, f.o.node.KeyFileContent()}
	if f.d.Config != nil {
		// The routing configuration decides per destination: an edit
		// of it, or of its key file, restarts the forward on SIGHUP.
		digest := f.d.Config.Digest()
		in = append(in, digest[:])
	}
	return in
}

func (f *tunnelForward) Start(ctx context.Context, e *base.Env, t *forward.Tracker) (net.Listener, func(net.Conn), func(), error) {
	o, d := f.o, f.d
	// What multi-link layers share (a mux session) lives as long as the
	// forward: every connection it accepts rides on it.
	closeAll := func() { d.Close() }
	if o.node.Given() {
		node, err := o.node.Connect(ctx, e, d.Key)
		if err != nil {
			return nil, nil, nil, err
		}
		d.Network, d.Member = node, o.node.Member()
		closeAll = func() {
			d.Close()
			node.Close()
		}
	}
	labels := metrics.Labels{Forward: e.ForwardName(f.ListenAddr()), Stack: f.label}
	if o.udp {
		l, err := o.listenUDP(ctx)
		if err != nil {
			closeAll()
			return nil, nil, nil, err
		}
		e.Log.Info("listening", "addr", l.Addr().String(), "udp", true, "to", o.to, "via", o.via, "stack", secret.RedactStack(o.stack))
		release := func() {
			if s, q := l.Dropped(); s+q+l.Evicted() > 0 {
				e.Log.Info("datagrams dropped while listening", "addr", l.Addr().String(), "no_session", s, "queue_full", q, "sessions_evicted", l.Evicted())
			}
			closeAll()
		}
		return l, func(c net.Conn) { o.handleUDP(e, t, d, labels, c) }, release, nil
	}
	l, err := listenOn(ctx, o.listenStack, o.listen)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	stack := secret.RedactStack(o.stack)
	if stack == "" {
		stack = "from the configuration"
		if d.Config.Source != "" {
			stack += " " + d.Config.Source
		}
	}
	if lp := o.startLoop(e, t, d, labels, l); lp != nil {
		e.Log.Info("listening", "addr", lp.Addr().String(), "to", o.to, "stack", stack, "event_loop", true)
		stopCut := t.CutLoop(lp)
		return lp, func(net.Conn) {}, func() {
			stopCut()
			closeAll()
		}, nil
	}
	e.Log.Info("listening", "addr", l.Addr().String(), "to", o.to, "via", o.via, "stack", stack)
	return l, func(c net.Conn) { o.handle(e, t, d, labels, c) }, closeAll, nil
}

// startLoop serves l on an event loop (netconn/evloop) when the forward
// is a plain relay to an IP address and --event-loop allows: a tcp stack
// alone, or no --stack and a configuration whose route to --to is
// direct; no --via, no node, listening on this host. It returns nil
// otherwise, or where there is no event loop, and l stays the
// goroutines'.
func (o *tunnelOptions) startLoop(e *base.Env, t *forward.Tracker, d *vlink.Dialer, labels metrics.Labels, l net.Listener) *evloop.Loop {
	tl, ok := l.(*net.TCPListener)
	if !ok || !o.eventLoop || o.listenStack != "" || o.via != "" || o.node.Given() {
		return nil
	}
	to, err := netip.ParseAddrPort(o.to)
	if err != nil || to.Addr().Zone() != "" {
		return nil // a name: the goroutines resolve it for each connection
	}
	cfg := evloop.Config{Target: to, DialTimeout: o.dialTimeout}
	if o.stack == "" {
		// As the Dialer dials a direct route: net.Dialer's zero value,
		// which evloop's nil DialControl mirrors.
		if !directRoute(d.Config, o.to) {
			return nil
		}
	} else {
		f := loopFactory(o.stack, to.Addr())
		if f == nil {
			return nil
		}
		cfg.DialControl = f.PrepareSocket
	}
	lp, err := evloop.Listen(tl, cfg, t.LoopHandler(e.Log, labels, l.Addr().String(), o.to))
	if err != nil {
		if !errors.Is(err, evloop.ErrUnsupported) {
			e.Log.Warn("no event loop; a goroutine per connection", "err", err)
		}
		return nil
	}
	return lp
}

// directRoute reports whether cfg routes address straight to it, plain
// TCP with no layer and no gateway.
func directRoute(cfg *vlink.Config, address string) bool {
	if cfg == nil {
		return false
	}
	sel := cfg.Selector()
	if sel == nil {
		return true // no rules: everything direct
	}
	r, err := sel.Match(address)
	return err == nil && r.Action == selector.Direct
}

// loopFactory returns the tcp factory of a stack that is tcp alone, with
// parameters the event loop carries out (tcp.PreparedLayer); else nil.
func loopFactory(stack string, target netip.Addr) *tcp.Factory {
	s, err := vlink.Parse(stack)
	if err != nil || len(s.Layers) != 1 {
		return nil
	}
	return tcp.PreparedLayer(s.Layers[0].Name, s.Layers[0].Params, target)
}

// open builds the Dialer the flags describe, with the pin check and,
// when the flags make the command a node, the node's network. The
// returned func closes both.
func (o *dialOptions) open(ctx context.Context, e *base.Env) (*vlink.Dialer, func(), error) {
	d, err := o.dialer()
	if err != nil {
		return nil, nil, err
	}
	base.WarnPassword(e, "--stack", o.stack)
	base.SetPins(o.knownNodes, e.Log, &d.PeerKey, &d.PinnedKey)
	if !o.node.Given() {
		return d, func() { d.Close() }, nil
	}
	node, err := o.node.Connect(ctx, e, d.Key)
	if err != nil {
		return nil, nil, err
	}
	d.Network, d.Member = node, o.node.Member()
	return d, func() {
		d.Close()
		node.Close()
	}, nil
}

// handle carries one local connection to --to through d, counted in the
// metrics under labels, with the transport the dial took.
func (o *tunnelOptions) handle(e *base.Env, t *forward.Tracker, d *vlink.Dialer, labels metrics.Labels, c net.Conn) {
	// listen names the forward (its own, bounded: from the command line
	// or the forwards file).
	attrs := []any{"remote", c.RemoteAddr().String(), "listen", c.LocalAddr().String(), "to", o.to}
	e.Log.Debug("connection", attrs...)
	start := time.Now()
	var rc net.Conn
	var err, readErr error
	if o.earlyWait > 0 {
		rc, err = d.DialEarly(t.Ctx, "tcp", o.to, func() []byte {
			// Called only when the first flight can carry them.
			var b []byte
			b, readErr = readEarly(c, o.earlyWait)
			return b
		})
	} else {
		rc, err = d.DialContext(t.Ctx, "tcp", o.to)
	}
	if err == nil && readErr != nil {
		// The client reset, or failed: a later read could say EOF, so
		// its failure goes on now.
		netconn.Abort(rc)
		netconn.Abort(c)
		e.Log.Debug("client failed before its first bytes", append(attrs, "err", readErr)...)
		return
	}
	if err == nil {
		labels.Transport = metrics.Transport(rc)
	}
	t.Metrics.Dialed(labels, time.Since(start), err)
	if err != nil {
		// A reset: the client must not read a clean, empty stream.
		netconn.Abort(c)
		if !errors.Is(err, context.Canceled) {
			e.Log.Info("cannot reach destination", append(attrs, "err", err)...)
		}
		return
	}
	if way := vlink.PathOf(rc); way != "" {
		attrs = append(attrs, "way", way)
		e.Log.Debug("connected", attrs...)
	}
	t.Relay(e.Log, labels, c, rc, attrs...)
}

// earlySize is the most of a client's first bytes a tunnel sends with
// the hello: a request's head, well within what a first message holds.
const earlySize = 16 << 10

// readEarly returns what client c sends within wait, up to earlySize
// bytes, for the first flight. Its end (io.EOF) is no error: the relay
// reads it again. A failure is.
func readEarly(c net.Conn, wait time.Duration) ([]byte, error) {
	buf := make([]byte, earlySize)
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return nil, nil // the relay meets it
	}
	n, err := c.Read(buf)
	if errors.Is(err, os.ErrDeadlineExceeded) || err == io.EOF {
		err = nil
	}
	if derr := c.SetReadDeadline(time.Time{}); err == nil {
		err = derr
	}
	return buf[:n], err
}

// isNode reports whether address names a node of a vlink network, which
// relays datagrams to its own ports as a gateway does.
func isNode(address string) bool {
	_, _, ok := vlink.SplitNodeAddr(address)
	return ok
}

// listenUDP listens on --listen's UDP port, one session per client.
func (o *tunnelOptions) listenUDP(ctx context.Context) (*dgram.Listener, error) {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", o.listen)
	if err != nil {
		return nil, err
	}
	l, err := dgram.ListenConfig{MaxSessions: o.udpSessions}.Listen(pc.(*net.UDPConn))
	if err != nil {
		pc.Close()
	}
	return l, err
}

// handleUDP carries one client's datagrams to --to through d.
func (o *tunnelOptions) handleUDP(e *base.Env, t *forward.Tracker, d *vlink.Dialer, labels metrics.Labels, c net.Conn) {
	attrs := []any{"remote", c.RemoteAddr().String(), "to", o.to, "udp", true}
	e.Log.Debug("datagram session", attrs...)
	start := time.Now()
	rc, err := d.DialContext(t.Ctx, "udp", o.to)
	if err == nil {
		labels.Transport = metrics.Transport(rc)
	}
	t.Metrics.Dialed(labels, time.Since(start), err)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			e.Log.Info("cannot reach destination", append(attrs, "err", err)...)
		}
		// The client's datagrams are dropped for a second, so that a
		// refusing gateway is not asked again for each one.
		select {
		case <-time.After(time.Second):
		case <-t.Ctx.Done():
		}
		c.Close()
		return
	}
	t.RelayDatagrams(e.Log, o.udpIdleTimeout, labels, c, rc, attrs...)
}

// listenOn listens on addr, on this host or, given a stack, through its
// top factory (on an SSH server's side for ssh).
func listenOn(ctx context.Context, stack, addr string) (net.Listener, error) {
	if stack == "" {
		var lc net.ListenConfig
		return lc.Listen(ctx, "tcp", addr)
	}
	s, err := vlink.Parse(stack)
	if err != nil {
		return nil, base.Usagef("--listen-stack: %v", err)
	}
	return vlink.ListenStack(ctx, s, "tcp", addr)
}

// viaChain reads --via: a gateway, or a chain of nodes ending with one,
// HOST:PORT,HOST:PORT,...; the nodes before the gateway become the
// stack's fwd layers, the first reached first.
func viaChain(s vlink.Stack, via string) (vlink.Stack, string, error) {
	nodes := strings.Split(via, ",")
	for _, n := range nodes { // first: the errors below quote via
		if err := base.CheckHostPort(n); err != nil {
			return s, "", base.Usagef("--via %v", err)
		}
	}
	if len(nodes) > vlink.MaxHops {
		return s, "", base.Usagef("--via %s: %d nodes, at most %d", via, len(nodes), vlink.MaxHops)
	}
	gw := nodes[len(nodes)-1]
	s, err := s.Through(nodes[:len(nodes)-1]...)
	if err != nil {
		return s, "", base.Usagef("--via %s: %v", via, err)
	}
	return s, gw, nil
}

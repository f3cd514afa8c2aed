package dial

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/forward"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/vlink"
)

var SocksCmd = &cli.Command{
	Name:     "socks",
	Summary:  "a local SOCKS5/SOCKS4 server whose connections follow a stack or the user's rules",
	Synopsis: "[--stack STACK [--via HOST:PORT]] [--config FILE] [flags]",
	About: `
Serves SOCKS5 (CONNECT), SOCKS4 and SOCKS4a on a local port, so programs that
already speak SOCKS (curl --socks5-hostname, browsers, git, ssh -o
ProxyCommand) reach their destinations through any stack, without the
preload shim. Each destination is dialed with --stack (and --via), or, with
no --stack, per destination by the routing rules of --config or of the
user's configuration (VLINK_CONFIG, default ~/.config/vlink/config.toml,
VLINK_STACK, VLINK_VIA); with none of them, directly.

Names are not resolved here: a name the client sends (SOCKS5 with a host
name, SOCKS4a) goes through the stack as it is, so with an ssh or socks5
stack the far side resolves it and internal names work. BIND is answered
"command not supported".

SOCKS5 UDP ASSOCIATE (RFC 1928) is served: the client's datagrams go to
the destinations their headers name, each destination a datagram session
of the route (through a --via gateway, whose vlink serve --allow-udp must
match it; a plain route sends them from this host; an ssh or proxy stack
carries no UDP), and the answers come back to that client only, from the
address the association was granted on. Fragmented datagrams (FRAG other
than 0) are dropped, as the RFC allows; the association ends with the
client's TCP connection.

It listens on loopback unless --listen says otherwise, and even then it
serves only loopback clients and those --allow-from names: it is never an
open proxy. With --user and --password-file, SOCKS5 clients must
authenticate (RFC 1929), and SOCKS4 clients, which cannot, are refused.
`,
	Examples: `
  # Every connection through an SSH bastion; names are resolved there:
  vlink socks --listen 127.0.0.1:1080 --stack ssh:host=bastion.example
  curl --socks5-hostname 127.0.0.1:1080 http://internal-name/

  # Through a corporate SOCKS5 proxy that wants a password:
  vlink socks --stack socks5:addr=proxy.example:1080,user=alice,password-file=$HOME/.proxy-pw

  # DNS over SOCKS5 UDP, through a gateway (vlink serve --allow-udp '*:53'):
  vlink socks --stack zstd --via gw.example:7000 --key-file vlink.key

  # Serve the LAN's 10.1.0.0/16 too, with a password of its own:
  vlink socks --listen 0.0.0.0:1080 --allow-from 10.1.0.0/16 \
      --user team --password-file socks.pw --stack ssh:host=bastion.example
`,
	Flags: base.WithEnv(socksFlags),
}

type socksOptions struct {
	listen, stack, via, keyFile, config, user, passwordFile string
	knownNodes                                              string
	allowFrom                                               base.ListFlag
	handshakeTimeout, dialTimeout, grace, stats             time.Duration
	insecurePlaintext, udp                                  bool
	udpIdleTimeout                                          time.Duration
	node                                                    base.NodeOptions
	metrics                                                 string
	label                                                   string // the metrics' stack label, set by run
}

// maxSOCKSHandshakes bounds the handshakes in progress, and so what slow
// or hostile clients can hold.
const maxSOCKSHandshakes = 256

func socksFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	o := &socksOptions{}
	fs.StringVar(&o.listen, "listen", "127.0.0.1:1080", "accept SOCKS clients on `ADDR` (host:port)")
	fs.StringVar(&o.stack, "stack", "", "reach every destination through `STACK`, e.g. ssh:host=bastion or socks5:addr=proxy:1080; with --node, filters such as zstd reach the nodes' ports, which mirror them (default: the configuration decides per destination)")
	fs.StringVar(&o.via, "via", "", "go through the VLink gateway at `HOST:PORT` (vlink serve --allow), or a chain of nodes HOST:PORT,HOST:PORT,... ending with the gateway (see vlink tunnel --help); needs --stack")
	fs.StringVar(&o.keyFile, "key-file", "", "prove to the gateway that we hold the pre-shared key in `FILE`; needs --stack")
	fs.StringVar(&o.config, "config", "", "route destinations by the rules of the config `FILE` (default: VLINK_CONFIG or ~/.config/vlink/config.toml, if any)")
	fs.Var(&o.allowFrom, "allow-from", "also serve clients from `CIDR`, e.g. 10.1.0.0/16 (repeatable; loopback clients are always served; default: none)")
	fs.StringVar(&o.user, "user", "", "require SOCKS5 clients to authenticate as `NAME` (needs --password-file)")
	fs.StringVar(&o.passwordFile, "password-file", "", "the password clients must give, read from `FILE` (mode 600)")
	fs.DurationVar(&o.handshakeTimeout, "handshake-timeout", vlink.DefaultHandshakeTimeout, "close a client whose SOCKS handshake, destination dial included, takes longer than `DURATION`")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 10*time.Second, "give up reaching a destination after `DURATION`")
	fs.BoolVar(&o.udp, "udp", true, "serve SOCKS5 UDP ASSOCIATE: each client's datagrams go to the destinations they name as the routes say (through a --via gateway, vlink serve --allow-udp; a route with no gateway sends them from this host), and only that client gets the answers; --udp=false answers it \"command not supported\"")
	fs.DurationVar(&o.udpIdleTimeout, "udp-idle-timeout", 2*time.Minute, "end a UDP association's session with a destination after `DURATION` without a datagram either way")
	base.InsecurePlaintextVar(fs, &o.insecurePlaintext)
	base.KnownNodesVar(fs, &o.knownNodes)
	base.NodeFlags(fs, &o.node, "so that clients reach other nodes' ports as NODE.vlink.alt:PORT (socks5h or socks4a: the name goes to vlink) through the relay")
	base.ReverseFlag(fs, &o.node)
	base.GraceVar(fs, &o.grace)
	metrics.FlagVar(fs, &o.metrics)
	forward.StatsVar(fs, &o.stats)
	return func(ctx context.Context, e *base.Env) int {
		if err := o.run(ctx, e); err != nil {
			return base.Fail(e, "vlink socks", err)
		}
		return base.ExitOK
	}
}

// setup builds the dialer, the SOCKS server and the client filter the
// flags describe.
func (o *socksOptions) setup() (*socks.Server, []netip.Prefix, string, error) {
	if o.handshakeTimeout <= 0 || o.dialTimeout <= 0 || o.udp && o.udpIdleTimeout <= 0 || o.grace < 0 || o.stats < 0 {
		return nil, nil, "", base.Usagef("--handshake-timeout, --dial-timeout and --udp-idle-timeout want positive durations, --grace and --stats 0 or more")
	}
	var allow []netip.Prefix
	for _, a := range o.allowFrom {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			ip, ierr := netip.ParseAddr(a)
			if ierr != nil {
				return nil, nil, "", base.Usagef("--allow-from %q: want a CIDR prefix like 10.1.0.0/16 or an address", a)
			}
			p = netip.PrefixFrom(ip, ip.BitLen())
		}
		allow = append(allow, p.Masked())
	}
	d := &vlink.Dialer{Timeout: o.dialTimeout, InsecurePlaintext: o.insecurePlaintext}
	route := ""
	switch {
	case o.stack != "":
		if o.config != "" {
			return nil, nil, "", base.Usagef("give --stack or --config, not both")
		}
		s, err := vlink.Parse(o.stack)
		if err != nil {
			return nil, nil, "", base.Usagef("--stack: %v", err)
		}
		if !s.IsPlain() && o.via == "" && !o.node.Given() {
			return nil, nil, "", base.Usagef("--stack %s has layers a VLink peer must mirror: add --via GATEWAY (a SOCKS destination is a plain server), or --node to reach the nodes of a vlink network, which do", secret.RedactStack(o.stack))
		}
		if o.via != "" {
			if s, d.Via, err = viaChain(s, o.via); err != nil {
				return nil, nil, "", err
			}
		}
		d.Stack, route = s, s.String()
		if d.Via != "" {
			route += " via " + d.Via
		}
		if o.keyFile != "" {
			if err := base.CheckKeyCarried(o.stack, s, o.via, &o.node); err != nil {
				return nil, nil, "", err
			}
			if d.Key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
				return nil, nil, "", err
			}
		}
	case o.via != "" || o.keyFile != "":
		return nil, nil, "", base.Usagef("--via and --key-file need --stack")
	case o.config != "":
		cfg, err := vlink.LoadConfig(o.config)
		if err != nil {
			return nil, nil, "", err
		}
		d.Config, route = cfg, "rules of "+o.config
	default:
		// Read now, so that a broken configuration stops the server
		// instead of failing every connection.
		cfg, err := vlink.DefaultConfig()
		if err != nil {
			return nil, nil, "", err
		}
		d.Config, route = cfg, "the user's configuration"
		if cfg.Source == "" {
			route = "direct (no configuration)"
		}
	}
	srv := &socks.Server{Dialer: d}
	if o.udp {
		srv.UDP = &socks.UDPConfig{Idle: o.udpIdleTimeout}
	}
	switch {
	case o.user != "" && o.passwordFile == "":
		return nil, nil, "", base.Usagef("--user needs --password-file")
	case o.user == "" && o.passwordFile != "":
		return nil, nil, "", base.Usagef("--password-file needs --user")
	case o.user != "":
		pw, err := secret.Password("", o.passwordFile, "")
		if err != nil {
			return nil, nil, "", err
		}
		srv.User, srv.Password = o.user, pw
	}
	return srv, allow, route, nil
}

func (o *socksOptions) run(ctx context.Context, e *base.Env) error {
	srv, allow, route, err := o.setup()
	if err != nil {
		return err
	}
	base.WarnPassword(e, "--stack", o.stack)
	if srv.UDP != nil {
		srv.UDP.Logger = e.Log
	}
	sd := srv.Dialer.(*vlink.Dialer)
	base.SetPins(o.knownNodes, e.Log, &sd.PeerKey, &sd.PinnedKey)
	if o.node.Given() {
		d := srv.Dialer.(*vlink.Dialer)
		node, err := o.node.Connect(ctx, e, d.Key)
		if err != nil {
			return err
		}
		defer node.Close()
		d.Network, d.Member = node, o.node.Member()
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", o.listen)
	if err != nil {
		return err
	}
	if ta, ok := l.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() && len(allow) == 0 {
		e.Log.Warn("listening beyond loopback with no --allow-from: only loopback clients will be served", "addr", l.Addr().String())
	}
	var allowed []string
	for _, p := range allow {
		allowed = append(allowed, p.String())
	}
	m, stopMetrics, err := metrics.Serve(ctx, e, o.metrics)
	if err != nil {
		l.Close()
		return err
	}
	defer stopMetrics()
	o.label = o.stackLabel()
	t := forward.NewTracker(m)
	defer forward.StartStats(e.Log, o.stats, t)() // before "listening": SIGUSR1 is ours then
	defer forward.IgnoreHangup(e.Log)()
	e.Log.Info("listening", "addr", l.Addr().String(), "route", route, "allow_from", strings.Join(allowed, ","), "auth", srv.User != "")
	sem := make(chan struct{}, maxSOCKSHandshakes)
	return t.AcceptLoop(ctx, e.Log, l, o.grace, func(c net.Conn) {
		if !clientAllowed(c.RemoteAddr(), allow) {
			m.Refused("client_not_allowed")
			e.Log.Info("refused client: not loopback and not in --allow-from", "remote", c.RemoteAddr().String())
			c.Close()
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			m.Refused("busy")
			e.Log.Warn("too many SOCKS handshakes in progress: client closed", "remote", c.RemoteAddr().String(), "max", maxSOCKSHandshakes)
			c.Close()
			return
		}
		t.Spawn(func() { o.handle(e, t, srv, sem, c) })
	})
}

// stackLabel is the metrics' label of the connections: the stack's
// (metrics.StackLabel), or "config" when the configuration decides per
// destination.
func (o *socksOptions) stackLabel() string {
	if s, err := vlink.Parse(o.stack); err == nil && o.stack != "" {
		return metrics.StackLabel(s)
	}
	return "config"
}

// clientAllowed: loopback clients always, others if a prefix holds them.
func clientAllowed(a net.Addr, allow []netip.Prefix) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	ip := ta.AddrPort().Addr().Unmap()
	if ip.IsLoopback() {
		return true
	}
	for _, p := range allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// handle runs one client's SOCKS handshake and relays its connection.
func (o *socksOptions) handle(e *base.Env, t *forward.Tracker, srv *socks.Server, sem chan struct{}, c net.Conn) {
	// Tracked during the handshake too, so shutdown can cut it.
	if !t.Add(c) {
		<-sem
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Ctx, o.handshakeTimeout)
	out, req, err := srv.Handshake(ctx, c)
	cancel()
	<-sem
	t.Remove(c)
	attrs := []any{"remote", c.RemoteAddr().String(), "socks", req.Version.String(), "dest", req.Dest}
	labels := metrics.Labels{Forward: o.listen, Stack: o.label}
	if err != nil {
		c.Close()
		switch {
		case errors.Is(err, context.Canceled):
		case errors.Is(err, socks.ErrClientAuth):
			t.Metrics.HandshakeFailed("socks_auth", time.Since(start))
			e.Log.Info("client refused", append(attrs, "err", err)...)
		case errors.Is(err, socks.ErrBadRequest):
			t.Metrics.HandshakeFailed("socks_bad_request", time.Since(start))
			e.Log.Info("client refused", append(attrs, "err", err)...)
		default:
			t.Metrics.Dialed(labels, 0, err)
			e.Log.Info("cannot reach destination", append(attrs, "err", err)...)
		}
		return
	}
	t.Metrics.HandshakeDone(metrics.StackNone, time.Since(start))
	if a := req.Association; a != nil {
		// The association lives as long as the client's connection;
		// shutdown cuts that, and so ends it.
		attrs = append(attrs[:4], "udp", a.Addr().String())
		if !t.Add(c) {
			return
		}
		e.Log.Debug("UDP association", attrs...)
		a.Serve(t.Ctx, c)
		t.Remove(c)
		c.Close()
		e.Log.Debug("UDP association ended", attrs...)
		return
	}
	if way := vlink.PathOf(out); way != "" {
		attrs = append(attrs, "way", way)
	}
	e.Log.Debug("connection", attrs...)
	labels.Transport = metrics.Transport(out)
	t.Relay(e.Log, labels, c, out, attrs...)
}

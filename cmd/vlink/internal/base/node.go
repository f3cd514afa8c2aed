package base

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/internal/tomlerr"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// NodeOptions are the flags that make a command a node of a vlink
// network: its name, the relay it registers with, its key.
type NodeOptions struct {
	name, relays, keyFile string
	relayStack            string
	reverseListen         string // dialing commands only
	// A member of a network with an owner (--cert, --cert-key, --owner,
	// --revocations); member is what Connect loaded from them.
	certFile, certKey, ownerFile, revocations string
	rulesFile                                 string // serve only
	member                                    *vlink.Member
}

// NodeFlags defines --node, --relay and --node-key-file; role says what
// being a node does for the command.
func NodeFlags(fs *flag.FlagSet, o *NodeOptions, role string) {
	fs.StringVar(&o.name, "node", "", "join the vlink network as the node called `NAME` (a DNS label: lower-case letters, digits, '-'), "+role+"; needs --relay")
	fs.StringVar(&o.relays, "relay", "", "the network's relay (vlink relay) at `HOST:PORT`, or several, comma-separated, tried in order (relays linked with --peer form one network: a node moves to the next when its relay dies); needs --node")
	fs.StringVar(&o.relayStack, "relay-stack", "", "reach the relay through the factories of `STACK` (an SSH server or a proxy the network lets out: ssh:host=bastion, socks5h://proxy:1080), the control connection's encryption on top (default: the route the configuration gives the relay's address, else direct)")
	fs.StringVar(&o.keyFile, "node-key-file", "", "the node's key, made with vlink key --node NAME --key-file NETWORK_KEY, in `FILE` (mode 600; default: derived from --key-file, if that holds the network key)")
	fs.StringVar(&o.certFile, "cert", "", "join as a member of a network with an owner: the node's certificate, in `FILE` (vlink cert sign), which names the node (--node may be left out); other nodes and the relay then hold no key of ours, and connections between members are encrypted end to end with the members' own keys; needs --cert-key and --owner")
	fs.StringVar(&o.certKey, "cert-key", "", "the node's own private key, in `FILE` (mode 600; vlink key --identity made it, and --cert binds its public half)")
	fs.StringVar(&o.ownerFile, "owner", "", "the network owner's public key, in `FILE` (vlink owner init wrote it): the relay's and other nodes' certificates must be signed by it")
	fs.StringVar(&o.revocations, "revocations", "", "the network's revocation list, in `FILE` (vlink cert revoke): certificates it names are refused; reread on SIGHUP (default: none)")
}

// RulesFlag defines --rules, for the commands that accept members'
// connections (serve).
func RulesFlag(fs *flag.FlagSet, o *NodeOptions) {
	fs.StringVar(&o.rulesFile, "rules", "", "the network's rules, in `FILE` (TOML: [[allow]] tables of from, to and ports; from and to a node's name, group:NAME or *): a member they do not let reach this node on the port it asks for is refused here, whatever the relay did (default: every member of the network); needs --cert")
}

// ReadRulesFile reads the network's rules from a TOML file of [[allow]]
// tables (nodecert.Rule).
func ReadRulesFile(path string) (*nodecert.Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Allow []nodecert.Rule `toml:"allow"`
	}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("rules %w", tomlerr.New(path, err))
	}
	rules, err := nodecert.NewRules(file.Allow)
	if err != nil {
		return nil, fmt.Errorf("rules %s: %w", path, err)
	}
	return rules, nil
}

// Member returns what --cert, --cert-key, --owner and --revocations make
// the command: a member of a network with an owner; nil without --cert.
// Connect loads it; it is nil before.
func (o *NodeOptions) Member() *vlink.Member { return o.member }

// loadMember reads the member's files.
func (o *NodeOptions) loadMember() (*vlink.Member, error) {
	switch {
	case o.certFile == "" && (o.certKey != "" || o.ownerFile != "" || o.revocations != "" || o.rulesFile != ""):
		return nil, Usagef("--cert-key, --owner, --revocations and --rules make the node a member of a network with an owner: give its certificate too (--cert FILE, from vlink cert sign)")
	case o.certFile == "":
		return nil, nil
	case o.certKey == "" || o.ownerFile == "":
		return nil, Usagef("--cert needs --cert-key (the node's private key, vlink key --identity) and --owner (the network owner's public key)")
	case o.keyFile != "":
		return nil, Usagef("--cert and --node-key-file: a member proves its certificate, not a node key; give one or the other")
	}
	cert, err := nodecert.ReadCertificateFile(o.certFile)
	if err != nil {
		return nil, err
	}
	priv, err := vlink.ReadIdentityFile(o.certKey)
	if err != nil {
		return nil, err
	}
	owner, err := nodecert.ReadOwnerPublicKeyFile(o.ownerFile)
	if err != nil {
		return nil, err
	}
	trust, err := nodecert.NewTrust(owner, o.revocations)
	if err != nil {
		return nil, err
	}
	m := &vlink.Member{Cert: cert, Private: priv, Trust: trust}
	if o.rulesFile != "" {
		if m.Rules, err = ReadRulesFile(o.rulesFile); err != nil {
			return nil, err
		}
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("--cert %s: %w", o.certFile, err)
	}
	if o.name != "" && o.name != cert.Name() {
		return nil, Usagef("--node %s: the certificate in %s names the node %s", o.name, o.certFile, cert.Name())
	}
	return m, nil
}

// ReverseFlag defines --reverse-listen, for the commands that dial nodes.
func ReverseFlag(fs *flag.FlagSet, o *NodeOptions) {
	fs.StringVar(&o.reverseListen, "reverse-listen", "", "let the nodes we dial connect back to us on `ADDR` (host:port other nodes can reach, e.g. 0.0.0.0:7200), so that a node behind a firewall that lets no connection in is reached directly; needs --node (default: off: a dial to a node tries the spliced path, both nodes connecting at once, then has the relay carry the bytes)")
}

// KeyFileContent is what --node-key-file holds, for a reload to notice
// a new key (nil: none, or unreadable, which connect reports).
func (o *NodeOptions) KeyFileContent() []byte {
	if o.keyFile == "" {
		return nil
	}
	b, _ := os.ReadFile(o.keyFile)
	return b
}

// Given reports whether the command is to be a node.
func (o *NodeOptions) Given() bool {
	return o.name != "" || o.relays != "" || o.keyFile != "" || o.relayStack != "" || o.reverseListen != "" || o.certFile != ""
}

// Connect registers the node with its relay; networkKey, if any, is the
// command's --key-file, from which the node key can be derived.
func (o *NodeOptions) Connect(ctx context.Context, e *Env, networkKey []byte) (*control.Node, error) {
	member, err := o.loadMember()
	if err != nil {
		return nil, err
	}
	if member != nil {
		o.member, o.name = member, member.Cert.Name()
	}
	switch {
	case member != nil && o.relays == "":
		return nil, Usagef("--cert makes this command a node of a network with an owner: give the network's relay too (--relay HOST:PORT)")
	case o.name == "" || o.relays == "":
		return nil, Usagef("--node NAME and --relay HOST:PORT go together: the node registers under its name with the relay")
	}
	if !vlink.ValidNodeName(o.name) {
		return nil, Usagef("--node %q: %v", o.name, vlink.ErrBadNodeName)
	}
	var relays []string
	for r := range strings.SplitSeq(o.relays, ",") {
		if err := CheckHostPort(strings.TrimSpace(r)); err != nil {
			return nil, Usagef("--relay %v", err)
		}
		relays = append(relays, strings.TrimSpace(r))
	}
	var key []byte
	switch {
	case member != nil:
	case o.keyFile != "":
		var err error
		if key, err = vlink.ReadKeyFile(o.keyFile); err != nil {
			return nil, err
		}
	case networkKey != nil:
		key = vlink.NodeKey(networkKey, o.name)
	default:
		return nil, Usagef("--node %s needs its key: --node-key-file FILE, made with vlink key --node %s --key-file NETWORK_KEY (or the network key itself in --key-file)", o.name, o.name)
	}
	if o.reverseListen != "" {
		if err := CheckHostPort(o.reverseListen); err != nil {
			return nil, Usagef("--reverse-listen %v", err)
		}
	}
	if member != nil && o.revocations != "" {
		go watchRevocations(ctx, e, member.Trust, o.revocations)
	}
	cfg := control.Config{Name: o.name, Key: key, Member: member, Relays: relays, Logger: e.Log}
	dialer, err := o.relayDialer(e, cfg)
	if err != nil {
		return nil, err
	}
	if dialer != nil {
		cfg.Dialer = dialer
	}
	ctx, cancel := context.WithTimeout(ctx, vlink.DefaultHandshakeTimeout)
	defer cancel()
	n, err := control.Connect(ctx, cfg)
	switch {
	case errors.Is(err, vlink.ErrRefused) && member != nil:
		return nil, errors.Join(err, errors.New("the relay refused the node: is its certificate signed by the relay's owner, valid now and not revoked?"))
	case errors.Is(err, vlink.ErrRefused):
		return nil, errors.Join(err, errors.New("the relay refused the node: is its key made from the relay's network key, for this very name?"))
	}
	if err != nil || o.reverseListen == "" {
		return n, err
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", o.reverseListen)
	if err != nil {
		n.Close()
		return nil, err
	}
	if err := n.ServeReverse(l); err != nil { // until the node is closed
		l.Close()
		n.Close()
		return nil, err
	}
	e.Log.Info("accepting reverse connections", "addr", l.Addr().String())
	return n, nil
}

// relayDialer returns the dialer of the control connection: the
// encryption layer over the factories of --relay-stack, or of the route
// the configuration gives the relays' address, so that a node that gets
// out only through SSH or a proxy still joins; nil for direct (control's
// default).
func (o *NodeOptions) relayDialer(e *Env, cfg control.Config) (*vlink.Dialer, error) {
	relays := cfg.Relays
	text, from := o.relayStack, "--relay-stack"
	if text == "" {
		cfg, err := vlink.DefaultConfig()
		if err != nil {
			return nil, err
		}
		rule, err := cfg.Selector().Match(relays[0])
		if err == nil && rule.Action == selector.Refuse {
			return nil, fmt.Errorf("the configuration refuses the relay's address %s (%s): give --relay-stack, or a route for it", relays[0], cfg.Source)
		}
		if err != nil || rule.Action == selector.Direct || rule.Stack == "" || rule.Via != "" {
			return nil, nil // direct; a gateway cannot carry a control connection
		}
		text, from = rule.Stack, "the configuration's route for "+relays[0]
	}
	s, err := vlink.Parse(text)
	if err != nil {
		return nil, Usagef("--relay-stack: %v", err)
	}
	var layers []vlink.Layer
	for _, l := range s.Layers {
		spec, _ := layer.Lookup(l.Name)
		switch {
		case spec.Kind == layer.KindFactory && !spec.Nodes:
			layers = append(layers, l)
		case o.relayStack != "":
			return nil, Usagef("--relay-stack %s: layer %s is not a factory that reaches a host (ssh, socks5, http, tcp): the control connection's own layers are fixed", secret.RedactStack(text), l.Name)
		}
	}
	if len(layers) == 0 {
		return nil, nil
	}
	d := control.RelayDialer(cfg, layers)
	e.Log.Info("reaching the relay through a stack", "stack", d.Stack.String(), "from", from)
	return d, nil
}

// watchRevocations rereads the revocation list on each SIGHUP until ctx
// ends: from then on, hellos from the certificates it names are refused.
// A list that does not parse leaves the old one in force, and says so.
// Connections already made stay up.
func watchRevocations(ctx context.Context, e *Env, trust *nodecert.Trust, path string) {
	hup := make(chan os.Signal, 1)
	notifyHangup(hup)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := trust.Reload(); err != nil {
				e.Log.Error("revocation list not reloaded, the old one stays", "file", path, "err", err)
				continue
			}
			e.Log.Info("revocation list reloaded", "file", path, "revoked", trust.Revocations().Len())
		case <-ctx.Done():
			return
		}
	}
}

package vlink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// DefaultHandshakeTimeout bounds a handshake when neither the context nor
// the Dialer or ListenConfig sets a limit. It is
// layer.DefaultHandshakeTimeout, which layers use for their own setup.
const DefaultHandshakeTimeout = layer.DefaultHandshakeTimeout

// waitBeyond is how long every listener lets a dialer wait for its
// target (DefaultHandshakeTimeout): a hello names only a longer wait
// (Hello.TargetWait), so that a listener older than the field takes
// the usual hello. Tests shorten it.
var waitBeyond = DefaultHandshakeTimeout

// targetWait is the wait a hello names, in milliseconds: how long ctx
// lets the dialer wait for a connection to target, when that is beyond
// waitBeyond, as a program's own connect timeout may be (vlink exec);
// else 0. Lookups and datagram sessions wait for no connection.
func targetWait(ctx context.Context, target string, lookup, datagram bool) uint32 {
	dl, ok := ctx.Deadline()
	if !ok || target == "" || lookup || datagram {
		return 0
	}
	left := time.Until(dl)
	if left <= waitBeyond {
		return 0
	}
	return uint32(min(left/time.Millisecond, 1<<32-1))
}

// A Dialer connects through a VLink stack. Its zero value follows the
// user's configuration (see [LoadConfig]), which with no configuration at
// all means plain TCP, so a zero Dialer is a drop-in net.Dialer.
// DialContext has the signature http.Transport.DialContext expects.
type Dialer struct {
	// Stack is the stack to dial with. Zero means: chosen per destination
	// by Config.
	Stack Stack
	// Via is the host:port of a VLink listener (vlink serve) that
	// forwards to the destination. Empty means the destination is itself
	// a VLink listener, or a plain server if Stack is plain. Only used
	// with Stack.
	Via string
	// Key is the pre-shared key proven to listeners that require one,
	// whether Stack or the Config's route picks the stack. Nil means: the
	// Config's key (and node), if any.
	Key []byte
	// Node is the dialer's node name (see ValidNodeName). With it, Key
	// must be that node's key, NodeKey(network key, Node), and every
	// hello names the node: listeners holding the network key then know
	// who dialed (Hello.Node), and no node can pass for another. Empty
	// means none, or the Config's when Key is nil. A Node without a key
	// is an error (ErrKeyRequired).
	Node string
	// Network reaches the addresses that name nodes of a vlink network
	// (NODE.vlink.alt:PORT, see NodeSuffix): a *control.Node connected
	// to the network's relay. Nil means such addresses cannot be dialed.
	Network NodeDialer
	// Config supplies the routing rules and key when Stack is zero. Nil
	// means DefaultConfig: the user's file and environment.
	Config *Config
	// Timeout bounds the whole dial, handshake included. Zero means no
	// limit beyond the context's and DefaultHandshakeTimeout for the
	// handshake.
	Timeout time.Duration
	// InsecurePlaintext keeps a stack as it is. By default, with a key
	// (Key or the Config's), a stack that sends a hello to a peer beyond
	// loopback gets the encryption layer (EncryptionLayer) at the bottom
	// of its mirrored layers, unless it holds one: the bytes that leave
	// the host are encrypted and bound to the key. A plain stack (no
	// hello) is never changed. UNSAFE: set it only where the network
	// itself is trusted.
	InsecurePlaintext bool
	// PeerKey checks the static key a listener announces (its
	// Policy.Identity) before the encryption layer proves the listener
	// holds it; see PeerKeyCallback. Nil means the Config's PeerKey, and
	// with none, any key or none is accepted: the listener is then
	// authenticated by the pre-shared key alone, as one of the group
	// that holds it.
	PeerKey PeerKeyCallback
	// PinnedKey, if set, returns the static key PeerKey pinned for the
	// listener at address, nil for none (knownnodes.File.Pinned). A
	// Dialer's first flight to a listener it has not reached yet then
	// names that key and takes the short way (ARCHITECTURE §2, "The
	// first flight"), where it would go the long way to learn the key:
	// two round trips fewer for the first connection of each process,
	// such as every `vlink connect`. Nil means the Config's.
	PinnedKey func(address string) []byte
	// Member makes the dialer a member of a network with an owner, for
	// every route: its hellos carry Member.Cert instead of proving Key
	// (Key and Node are then not used, and the certificate names the
	// node), the listener must answer with a certificate Member.Trust
	// accepts, and the encryption layer, added below the mirrored layers
	// wherever a hello is sent, proves both keys. A node reached through
	// the network must present a certificate with its own name, so the
	// relay, which holds no key, can neither read nor take over the
	// connection. PeerKey is not used: certificates replace pinning.
	Member *Member
	// PeerCert, with Member, checks the listener's certificate further;
	// see PeerCertCallback. Nil accepts any the trust accepts.
	PeerCert PeerCertCallback
	// WaitAccept makes a dial through a layer that sends early data (mux,
	// see layer.EarlyDataLayer) return only once the listener has accepted
	// the connection, as every other dial does: a refused or unreachable
	// target then fails the dial, as it fails net.Dial, at the cost of one
	// round trip. False (the default) returns as soon as the hello is
	// sent, and a refusal comes from the first Read.
	WaitAccept bool
	// Shm says when a dial to a listener on this machine takes shared
	// memory; see ShmMode. Zero: $VLINK_SHM, else Config.Shm (the
	// config file's shm), else ShmAuto.
	Shm ShmMode

	// cache keeps the multi-link layers built by this Dialer, so dials
	// along the same path share them; memory what its best-effort dials
	// learnt. A Dialer must not be copied after its first dial.
	cache  layerCache
	memory memory
	// checked is the Member last validated, and its key, so that each
	// dial does not derive the public key again (see withMember).
	checked struct {
		sync.Mutex
		m     *Member
		cert  *nodecert.Certificate
		trust *nodecert.Trust
		priv  []byte
	}
}

// A PeerKeyCallback checks the static public key (X25519, 32
// bytes) that the listener at address announced in its accept, before the
// encryption layer proves the listener holds its private half. address is
// the listener dialed: the destination, or the gateway (Dialer.Via), as
// written in the stack or the config. key is nil when the listener
// announced none, which a callback that pinned a key must refuse (a
// downgrade). It is called only for a hello whose stack holds the
// encryption layer; an error fails the dial. Package
// github.com/vlink-dev/vlink/vlink/knownnodes pins keys on first use and
// checks them afterwards, as OpenSSH's known_hosts does.
type PeerKeyCallback func(address string, key []byte) error

// DefaultDialer is the zero Dialer used by [Dial] and [DialContext]: it
// follows the user's configuration and shares multi-link layers (a
// multiplexed session) between their calls. A program that joins a vlink
// network sets its Network, before its first dial, so that Dial reaches
// NODE.vlink.alt:PORT too:
//
//	node, err := control.Connect(ctx, control.Config{...})
//	vlink.DefaultDialer.Network = node
//	c, err := vlink.Dial("tcp", "db.vlink.alt:5432")
var DefaultDialer = &Dialer{}

// Dial connects to address using the user's configuration; see
// [Dialer]. It is a drop-in replacement for net.Dial.
func Dial(network, address string) (net.Conn, error) {
	return DefaultDialer.DialContext(context.Background(), network, address)
}

// DialContext is Dial with a context governing the setup.
func DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return DefaultDialer.DialContext(ctx, network, address)
}

// Dial connects to address on the named network.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address on the named network. Networks other
// than tcp, tcp4 and tcp6 are dialed with a net.Dialer unchanged. The
// context governs the setup only: once connected, its expiry does not
// affect the connection. A best-effort route's connection says which way
// it took (PathOf).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.dial(ctx, network, address, nil, nil)
}

// DialReport is DialContext, and says how it chose: the route that
// matched and, for a best-effort route, every way it tried, when each
// started, how long it took and how it ended.
func (d *Dialer) DialReport(ctx context.Context, network, address string) (net.Conn, *RouteReport, error) {
	rep := &RouteReport{Address: address}
	c, err := d.dial(ctx, network, address, rep, nil)
	return c, rep, err
}

func (d *Dialer) dial(ctx context.Context, network, address string, rep *RouteReport, early *earlyDial) (net.Conn, error) {
	datagrams := false
	switch network {
	case "tcp", "tcp4", "tcp6":
	case "udp", "udp4", "udp6":
		datagrams = true
	default:
		return (&net.Dialer{Timeout: d.Timeout}).DialContext(ctx, network, address)
	}
	shm, err := d.shmMode()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	if node, port, ok := SplitNodeAddr(address); ok {
		r, err := d.nodeRoute(address, node, port)
		if err == nil {
			err = d.withMember(r)
		}
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
		}
		r.waitAccept = d.WaitAccept
		stream := network
		if datagrams {
			// As through a gateway: the node relays them to its own port.
			r.datagram, r.waitAccept, stream = true, true, "tcp"
		}
		c, err := r.dial(ctx, stream, address, &d.cache)
		if err != nil {
			return nil, err
		}
		if datagrams {
			c = datagramConn(c, r.carrier, addr{network, address})
		}
		var path string
		if p := r.transport.(*nodeTransport).path.Load(); p != nil {
			path = *p
		}
		if rep != nil {
			rep.Rule, rep.Way, rep.Path = r.describe(), r.stack.String(), path
			if l := r.transport.(*nodeTransport).ladder.Load(); l != nil {
				rep.Ladder = *l
			}
		}
		if path == "" {
			return c, nil
		}
		return &routedConn{Conn: c, way: path}, nil
	}
	r, err := d.route(address)
	if err == nil {
		r.waitAccept = d.WaitAccept
		r.shm = shm
		r.peerKey, r.pinned = d.PeerKey, d.PinnedKey
		if r.peerKey == nil && d.Config != nil {
			r.peerKey = d.Config.PeerKey
		}
		if r.pinned == nil && d.Config != nil {
			r.pinned = d.Config.PinnedKey
		}
		err = r.checkNode()
	}
	if err == nil {
		err = d.withMember(r)
	}
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	if rep != nil {
		rep.Rule = r.describe()
	}
	if datagrams {
		return d.dialDatagrams(ctx, network, address, r)
	}
	if r.best {
		c, err := d.race(ctx, network, address, r, rep)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
		}
		return c, nil
	}
	if !d.InsecurePlaintext {
		if r, err = r.encrypted(address); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
		}
	}
	if rep != nil {
		rep.Way = selector.TryDirect
		if len(r.stack.Layers) > 0 {
			rep.Way = r.stack.String()
		}
	}
	if early != nil {
		ctx = context.WithValue(ctx, earlyKey{}, early)
	}
	return r.dial(ctx, network, address, &d.cache)
}

// dialDatagrams opens a datagram session to address along r: through
// the route's gateway, which relays the datagrams to address as UDP, or,
// for a route with no layer to carry them, as UDP from this host.
func (d *Dialer) dialDatagrams(ctx context.Context, network, address string, r *route) (net.Conn, error) {
	fail := func(err error) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	if r.best {
		return fail(fmt.Errorf("%w: the route for %s is best-effort (%s), which races streams", ErrNoDatagrams, address, r.describe()))
	}
	_, via, err := r.vias()
	if err != nil {
		return fail(err)
	}
	if via == "" {
		if f := r.stack.factories(); r.stack.IsPlain() && (len(f) == 0 || len(f) == 1 && f[0].Name == "tcp") {
			return (&net.Dialer{}).DialContext(ctx, network, address) // direct
		}
		return fail(fmt.Errorf("%w: stack %s names no gateway to relay them to %s as UDP: give one (Dialer.Via, vlink tunnel --via)", ErrNoDatagrams, r.stack, address))
	}
	if !d.InsecurePlaintext {
		if r, err = r.encrypted(address); err != nil {
			return fail(err)
		}
	}
	// The gateway's answer comes first: a refused target is the dial's
	// error, not a session that swallows every datagram.
	r.datagram, r.waitAccept = true, true
	c, err := r.dial(ctx, "tcp", address, &d.cache)
	if re := (*RefusedError)(nil); errors.As(err, &re) && re.Code == CodeMalformed {
		// A listener from before datagram sessions refuses their hello
		// so; say what to do about it.
		return nil, fmt.Errorf("%w (a gateway older than datagram sessions refuses them so: upgrade it)", err)
	}
	if err != nil {
		return nil, err
	}
	return datagramConn(c, r.carrier, addr{network, address}), nil
}

// datagramConn returns the datagram session on c, over QUIC datagrams
// too when its hello asked for them (carrier non-nil).
func datagramConn(c net.Conn, carrier layer.DatagramCarrier, remote net.Addr) *dgram.Conn {
	if carrier != nil {
		return dgram.NewConnOver(c, carrier, nil, remote)
	}
	return dgram.NewConn(c, nil, remote)
}

// withMember makes r a member's route when the Dialer has a Member.
func (d *Dialer) withMember(r *route) error {
	if d.Member == nil {
		return nil
	}
	if err := d.validMember(); err != nil {
		return err
	}
	if len(r.stack.routes()) > 0 {
		return fmt.Errorf("%w: route layers (%s) do not carry certificates yet: a member dials its peer itself", ErrBadStack, Stack{Layers: r.stack.routes()})
	}
	r.member, r.peerCert = d.Member, d.PeerCert
	r.key, r.node = nil, ""
	return nil
}

// validMember validates d.Member in full the first time, and after any
// change to its certificate or key; then only what time changes (its
// certificate's validity and revocation, Trust.Check, which remembers
// the signatures it verified).
func (d *Dialer) validMember() error {
	m := d.Member
	d.checked.Lock()
	defer d.checked.Unlock()
	if d.checked.m == m && d.checked.cert == m.Cert && d.checked.trust == m.Trust && bytes.Equal(d.checked.priv, m.Private) {
		if err := m.Trust.Check(m.Cert, time.Now()); err != nil {
			return fmt.Errorf("%w: its own certificate: %w", ErrNotMember, err)
		}
		return nil
	}
	if err := m.Validate(); err != nil {
		return err
	}
	d.checked.m, d.checked.cert, d.checked.trust, d.checked.priv = m, m.Cert, m.Trust, bytes.Clone(m.Private)
	return nil
}

// Close closes what the Dialer keeps between dials: the multi-link layers
// it has built (a multiplexed session and its streams, say). The Dialer
// stays usable; connections it returned that do not depend on a closed
// layer are left alone.
func (d *Dialer) Close() error { return d.cache.close() }

// A route is what to do for one destination.
type route struct {
	stack Stack
	via   string
	key   []byte
	node  string // the dialer's node name; key is then its node key
	// member, when set, replaces key and node: see Dialer.Member.
	member   *Member
	peerCert PeerCertCallback
	// peerKey checks the identity of the listener a hello reaches;
	// pinned gives the key it pinned (Dialer.PinnedKey).
	peerKey PeerKeyCallback
	pinned  func(address string) []byte
	// transport, when set, reaches the destination instead of the
	// stack's factories, and the hello names target: a node's port,
	// reached through the network.
	transport layer.ContextDialer
	target    string
	// best: race ways, the config's best-effort route rule.
	best bool
	ways []way
	rule selector.Rule
	// waitAccept: Dialer.WaitAccept.
	waitAccept bool
	// lookup: the top hello asks whether the target's host resolves,
	// and no connection follows (Dialer.LookupHost).
	lookup bool
	// datagram: the top hello opens a datagram session (Hello.Datagram).
	datagram bool
	// carrier: set by the dial when its hello asked for QUIC datagrams
	// (Hello.QUICDatagrams), the quic stream that carries them.
	carrier layer.DatagramCarrier
	// shm: when a dial to this machine takes shared memory.
	shm ShmMode
}

// describe says what r does, for a RouteReport.
func (r *route) describe() string {
	switch {
	case r.best:
		return r.rule.String()
	case r.transport != nil:
		return "to a node, stack " + r.stack.String()
	case len(r.stack.Layers) == 0:
		return "direct"
	case r.via != "":
		return "stack " + r.stack.String() + " via " + r.via
	}
	return "stack " + r.stack.String()
}

// A NodeDialer connects to a port of a node of a vlink network. The
// connection it returns is Vouched: it comes with the peer's name and a
// key for it alone, which the hello proves. package control's *Node is
// one.
type NodeDialer interface {
	DialNode(ctx context.Context, node string, port uint16) (net.Conn, error)
}

// ErrNoNetwork is matched by the error of a dial to a node's address
// (NODE.vlink.alt:PORT) by a Dialer that has no Network to reach it.
var ErrNoNetwork = errors.New("the address names a node of a vlink network, and this dialer knows no network: set Dialer.Network to a connected control.Node (vlink tunnel --relay, --node)")

// nodeRoute is the route to port on node: the stack's mirrored layers,
// with the encryption layer at their bottom, over a connection the
// network sets up; the node's listener forwards to its own port, named
// as localhost:PORT in the hello, which its policy must allow. The
// stack's factory is tcp (the default: the network picks the path) or
// one that reaches nodes (layer.Spec.Nodes: reverse, relay), handed the
// network as its forward dialer.
func (d *Dialer) nodeRoute(address, node string, port uint16) (*route, error) {
	if d.Network == nil {
		return nil, ErrNoNetwork
	}
	r, err := d.route(address)
	if err != nil {
		return nil, err
	}
	if r.best {
		return nil, fmt.Errorf("%w: the route for %s is best-effort (%s), and a try list does not apply to a node, whose path the network chooses: put a rule for *%s before it (with a stack, or none)", ErrBadStack, address, r.describe(), NodeSuffix)
	}
	if r.via != "" {
		return nil, fmt.Errorf("%w: a node is reached through its network, not via %s", ErrBadStack, r.via)
	}
	if len(r.stack.routes()) > 0 {
		return nil, fmt.Errorf("%w: a node is reached through its network, not through route layers (%s)", ErrBadStack, Stack{Layers: r.stack.routes()})
	}
	network, ok := d.Network.(layer.ContextDialer)
	if !ok {
		network = networkDialer{d.Network}
	}
	transport := &nodeTransport{next: network}
	switch f := r.stack.factories(); {
	case len(f) == 0 || (len(f) == 1 && f[0].Name == "tcp"):
		// The network picks the path, within EnvPathsOnly and
		// EnvPathsExclude if it can take them.
		if only, exclude := d.pathFilters(); len(only)+len(exclude) > 0 {
			pd, ok := d.Network.(PathNodeDialer)
			if !ok {
				return nil, fmt.Errorf("%s or %s is set, and this network (%T) cannot choose its paths", EnvPathsOnly, EnvPathsExclude, d.Network)
			}
			allow := func(path string) bool {
				w := way{name: path}
				return (len(only) == 0 || w.matches(only)) && !w.matches(exclude)
			}
			transport.next = pathsDialer{pd, allow}
		}
	case len(f) == 1 && lookup(f[0].Name).Nodes:
		spec, v, err := f[0].build()
		if err != nil {
			return nil, err
		}
		fac, ok := v.(layer.Factory)
		if !ok {
			return nil, fmt.Errorf("layer %s: registered as a factory but is not one", spec.Name)
		}
		transport.next = &factoryDialer{f: fac, forward: network, stack: f[0].String()}
	default:
		return nil, fmt.Errorf("%w: a node is reached through its network; factories (%s) do not apply: use none, or one that reaches nodes (reverse, relay)", ErrBadStack, Stack{Layers: f})
	}
	mirrored := r.stack.mirrored()
	if keyedLayer(mirrored) == "" && !d.InsecurePlaintext {
		// The relay carries the bytes: encrypted end to end, always.
		if lookup(EncryptionLayer) == nil {
			return nil, fmt.Errorf("%w: reaching a node needs the %s layer: import github.com/vlink-dev/vlink/filters/noise (or vlink/layers)", ErrUnknownLayer, EncryptionLayer)
		}
		mirrored = append(mirrored[:len(mirrored):len(mirrored)], Layer{Name: EncryptionLayer})
	}
	return &route{
		// The factory stays in the stack, so multi-link layers over
		// different paths to a node are not shared.
		stack:     Stack{Layers: append(mirrored[:len(mirrored):len(mirrored)], r.stack.factories()...)},
		transport: transport,
		target:    net.JoinHostPort("localhost", strconv.Itoa(int(port))),
	}, nil
}

// A PathNodeDialer is a NodeDialer that can keep to some of its paths,
// by name ("reverse", "splice", "relay" for package control's *Node): the
// ways EnvPathsOnly and EnvPathsExclude narrow for a dial to a node.
type PathNodeDialer interface {
	NodeDialer
	DialNodeWays(ctx context.Context, node string, port uint16, allow func(path string) bool) (net.Conn, error)
}

// pathsDialer dials a node's address by the paths allow lets through.
type pathsDialer struct {
	pd    PathNodeDialer
	allow func(string) bool
}

func (p pathsDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	node, port, ok := SplitNodeAddr(address)
	if !ok {
		return nil, fmt.Errorf("%s is not a node's address (NODE%s:PORT)", address, NodeSuffix)
	}
	return p.pd.DialNodeWays(ctx, node, port, p.allow)
}

// pathFilters returns the path names EnvPathsOnly and EnvPathsExclude
// gave the Dialer's config, or the user's (a config that cannot be read
// filters nothing: the dial does not otherwise depend on it).
func (d *Dialer) pathFilters() (only, exclude []string) {
	cfg := d.Config
	if cfg == nil {
		cfg, _ = DefaultConfig()
	}
	if cfg == nil {
		return nil, nil
	}
	return cfg.only, cfg.exclude
}

// networkDialer dials a node's address with a NodeDialer.
type networkDialer struct{ nd NodeDialer }

func (n networkDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	node, port, ok := SplitNodeAddr(address)
	if !ok {
		return nil, fmt.Errorf("%s is not a node's address (NODE%s:PORT)", address, NodeSuffix)
	}
	return n.nd.DialNode(ctx, node, port)
}

// nodeTransport dials a node's address and takes only the connections
// the network vouches for. It serves one dial, and keeps the path the
// network says the connection took.
type nodeTransport struct {
	next   layer.ContextDialer
	path   atomic.Pointer[string] // a multi-link layer dials several at once
	ladder atomic.Pointer[[]PathStep]
}

func (t *nodeTransport) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := t.next.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if _, ok := c.(Vouched); !ok {
		c.Close()
		return nil, fmt.Errorf("the network's connection to %s comes with no key for it (not Vouched)", address)
	}
	if p, ok := c.(interface{ Path() string }); ok {
		path := p.Path()
		t.path.Store(&path)
	}
	if l, ok := c.(interface{ Ladder() []PathStep }); ok {
		ladder := l.Ladder()
		t.ladder.Store(&ladder)
	}
	return c, nil
}

// checkNode refuses a node name that is not valid, or that comes without
// the node's key to prove it.
func (r *route) checkNode() error {
	switch {
	case r.node == "":
		return nil
	case !ValidNodeName(r.node):
		return fmt.Errorf("node %q: %w", r.node, ErrBadNodeName)
	case r.key == nil:
		return fmt.Errorf("%w: node %q needs its node key (NodeKey of the network key and the name): set Dialer.Key or key_file in the config", ErrKeyRequired, r.node)
	}
	return nil
}

func (d *Dialer) route(address string) (*route, error) {
	if d.Node != "" && !ValidNodeName(d.Node) {
		return nil, fmt.Errorf("node %q: %w", d.Node, ErrBadNodeName)
	}
	if len(d.Stack.Layers) > 0 {
		key, node := d.Key, d.Node
		if key == nil && d.Config != nil {
			key = d.Config.Key
			if node == "" {
				node = d.Config.Node
			}
		}
		return &route{stack: d.Stack, via: d.Via, key: key, node: node}, nil
	}
	cfg := d.Config
	if cfg == nil {
		var err error
		if cfg, err = DefaultConfig(); err != nil {
			return nil, err
		}
	}
	r, err := cfg.route(address)
	switch {
	case err != nil:
	case d.Key != nil:
		r.key, r.node = d.Key, d.Node // the caller's key wins over the file's
	case d.Node != "":
		r.node = d.Node
	}
	return r, err
}

// EncryptionLayer is the layer a Dialer adds, and a Listener with a key
// requires, where bytes leave the host (see Dialer.InsecurePlaintext).
const EncryptionLayer = "noise"

// encrypted returns r with EncryptionLayer at the bottom of its mirrored
// layers when r has a key, sends a hello (has mirrored layers, or goes
// via a gateway) to a peer beyond loopback, and holds no layer bound to
// the key already; else r.
// Bottom, so that every byte on the wire is encrypted, the framing of the
// layers above included. A program that did not register the layer gets
// an error rather than plaintext on the network.
func (r *route) encrypted(address string) (*route, error) {
	vias, via, err := r.vias()
	if err != nil {
		return nil, err
	}
	peer := address
	if via != "" {
		peer = via
	}
	mirrored := r.stack.mirrored()
	sendsHello := len(mirrored) > 0 || via != ""
	local := isLoopbackHost(peer) && r.stack.hopsLocal()
	for _, v := range vias {
		local = local && isLoopbackHost(v)
	}
	// A member's certificate is proven by the encryption layer, so its
	// hellos hold it wherever they go.
	if r.member == nil && (r.key == nil || local || r.boundChannel(vias)) || !sendsHello || keyedLayer(mirrored) != "" {
		return r, nil
	}
	if lookup(EncryptionLayer) == nil {
		return nil, fmt.Errorf("%w: the key is set and %s is beyond loopback, so the stack needs the %s layer: import github.com/vlink-dev/vlink/filters/noise (or vlink/layers), or set Dialer.InsecurePlaintext", ErrUnknownLayer, peer, EncryptionLayer)
	}
	routes := r.stack.routes()
	if via != r.via {
		routes = routes[1:] // the last node is the gateway now, as Via
	}
	layers := make([]Layer, 0, len(r.stack.Layers)+1)
	layers = append(layers, mirrored...)
	layers = append(layers, Layer{Name: EncryptionLayer})
	layers = append(layers, routes...)
	layers = append(layers, r.stack.factories()...)
	out := *r
	out.stack, out.via = Stack{Layers: layers}, via
	return &out, nil
}

// boundChannel reports whether r's hello runs straight on a channel its
// factory encrypts and binds to the hello's proofs (layer.Spec.Encrypted):
// no route node in between, and no pinned listener identity, which only
// the encryption layer proves.
func (r *route) boundChannel(vias []string) bool {
	factories := r.stack.factories()
	if len(vias) > 0 || r.peerKey != nil || len(factories) != 1 {
		return false
	}
	spec := lookup(factories[0].Name)
	return spec != nil && spec.Encrypted
}

// hopsLocal reports whether every host s's factories connect to
// themselves (layer.Param.Hop: a proxy, an SSH server) is this host.
// A hop beyond loopback carries the bytes across a network whatever the
// destination's address says.
func (s Stack) hopsLocal() bool {
	for _, l := range s.factories() {
		spec := lookup(l.Name)
		if spec == nil {
			return false
		}
		for _, p := range spec.Params {
			if v, ok := l.Params[p.Name]; ok && p.Hop && !isLoopbackName(v) {
				return false
			}
		}
	}
	return true
}

// isLoopbackHost reports whether address (host:port) names this host
// by a loopback IP or "localhost". Any other name counts as remote: a
// wrong guess then costs an encryption, never a leak.
func isLoopbackHost(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	return isLoopbackName(host)
}

// isLoopbackName is isLoopbackHost for a hop as a layer names it:
// [user@]host[:port], an IPv6 host in brackets when a port follows.
func isLoopbackName(hop string) bool {
	if i := strings.LastIndexByte(hop, '@'); i >= 0 {
		hop = hop[i+1:]
	}
	if host, _, err := net.SplitHostPort(hop); err == nil {
		hop = host
	}
	host := strings.TrimSuffix(strings.TrimPrefix(hop, "["), "]")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().IsLoopback()
	}
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// isLoopback reports whether a is a loopback IP address, or the address
// of a shared-memory peer.
func isLoopback(a net.Addr) bool {
	if a != nil && a.Network() == "shm" {
		return true // shared memory: a process of this machine, by construction
	}
	ap, ok := netconn.AddrPort(a)
	return ok && ap.Addr().IsLoopback()
}

// dial builds the stack's dialer chain and dials through it. Multi-link
// layers are taken from cache, so dials along one path share them.
func (r *route) dial(ctx context.Context, network, address string, cache *layerCache) (net.Conn, error) {
	if len(r.stack.Layers) == 0 && r.transport == nil {
		var d net.Dialer // direct, exactly as net.Dial
		return d.DialContext(ctx, network, address)
	}
	fail := func(err error) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	transport := r.transport
	if transport == nil {
		var err error
		if transport, err = buildTransport(r.stack.factories()); err != nil {
			return fail(err)
		}
	}
	vias, via, err := r.vias()
	if err != nil {
		return fail(err)
	}
	if len(vias) > 0 {
		if r.member != nil {
			return fail(fmt.Errorf("%w: route layers do not carry certificates yet: a member dials its peer itself", ErrBadStack))
		}
		if r.transport != nil {
			return fail(fmt.Errorf("%w: a node is reached through its network, not through route layers", ErrBadStack))
		}
		transport = &fwdTransport{next: transport, vias: vias, node: r.node, key: r.key}
	}
	mirrored := r.stack.mirrored()
	if len(mirrored) == 0 && via == "" && r.target == "" {
		// Nothing to mirror: no hello, the factory's stream as is.
		return transport.DialContext(ctx, network, address)
	}
	// A node's connection brings its own key (Vouched).
	if name := keyedLayer(mirrored); name != "" && r.key == nil && r.member == nil && r.transport == nil {
		return fail(fmt.Errorf("%w: layer %s: set Dialer.Key, key_file in the config, VLINK_KEY_FILE or --key-file", ErrKeyRequired, name))
	}
	peer, target := address, r.target
	if via != "" {
		peer, target = via, address
	}
	if slices.Contains(vias, peer) {
		return fail(fmt.Errorf("%w: the route names %s twice", ErrLoop, peer))
	}
	if len(vias) == 0 {
		if transport, err = r.withShm(transport, peer); err != nil {
			return fail(err)
		}
	}
	// Build bottom-up, one hello per segment: the bottom one on the
	// factory's stream, each one above on what a multi-link layer built.
	// Only the top hello names the target.
	segs := segments(mirrored)
	if r.member != nil {
		// The hello on the connection itself carries the certificate,
		// and its segment's encryption layer proves it.
		if keyedLayer(segs[len(segs)-1]) == "" {
			return fail(fmt.Errorf("%w: a member proves its certificate with the %s layer, which must be below the multi-link layers (%s): put it last in the stack", ErrBadStack, EncryptionLayer, r.stack))
		}
		for _, seg := range segs[:len(segs)-1] {
			if name := keyedLayer(seg); name != "" {
				return fail(fmt.Errorf("%w: a member encrypts once, below the multi-link layers: layer %s above one has no key to use", ErrBadStack, name))
			}
		}
	}
	var d layer.ContextDialer
	early := false
	proven := false        // an encrypted segment below proves the listener's identity
	below := len(mirrored) // index in mirrored of the bottom segment's first layer
	for i := len(segs) - 1; i >= 0; i-- {
		seg := segs[i]
		below -= len(seg)
		segTarget := ""
		if i == 0 {
			segTarget = target
		}
		stack := helloStack(seg)
		// The first segment that encrypts proves the listener's identity.
		var peerKey PeerKeyCallback
		var pinned func(string) []byte
		if keyedLayer(seg) != "" && !proven {
			peerKey, pinned, proven = r.peerKey, r.pinned, true
		}
		if d == nil {
			d = &helloDialer{next: transport, peer: peer, target: segTarget, node: r.node, key: r.key, stack: stack, hops: len(vias), lookup: r.lookup && i == 0, datagram: r.datagram && i == 0, peerKey: peerKey,
				member: r.member, peerCert: r.peerCert, carrier: &r.carrier, cc: congestionOf(transport), aeads: aeadOffer(seg),
				first: r.key != nil && r.member == nil && r.transport == nil && len(vias) == 0 && !r.lookup && !r.datagram && firstFlighter(seg), statics: &cache.statics,
				pinned: pinned, early: len(segs) == 1}
		} else {
			// A layer bound to the transcript needs the answer first.
			early = early && keyedLayer(seg) == ""
			d = &nestedHelloDialer{next: d, peer: peer, stack: stack, target: segTarget, key: r.key, early: early, lookup: r.lookup && i == 0, datagram: r.datagram && i == 0, peerKey: peerKey}
		}
		early = false
		if r.lookup && i == 0 {
			break // the listener answers the top hello and builds nothing above it
		}
		for j := len(seg) - 1; j >= 0; j-- {
			spec, v, err := seg[j].build()
			if err != nil {
				return fail(err)
			}
			switch f := v.(type) {
			case layer.Filter:
				// Below a filter is its segment's hello or another filter.
				d = &filterDialer{name: spec.Name, f: f, next: d.(segmentDialer)}
			case layer.MultiLink:
				lowerStack := Stack{Layers: r.stack.Layers[below+j:]}
				path := pathOf(network, peer, lowerStack, r.key)
				ml, err := cache.get(seg[j].String()+" over "+path, func() (layer.MultiLink, error) { return f, nil })
				if err != nil {
					return fail(err)
				}
				d = &multiLinkDialer{ml: ml, lower: &lowerDialer{ContextDialer: d, path: path}}
				if e, ok := ml.(layer.EarlyDataLayer); ok && e.EarlyData() && !r.waitAccept {
					early = true // for the nested hello of the segment above
				}
			default:
				return fail(fmt.Errorf("%w: layer %s: a %s that is neither a Filter nor a MultiLink", ErrBadStack, spec.Name, spec.Kind))
			}
		}
	}
	return d.DialContext(ctx, network, address)
}

// buildTransport chains the factories: each reaches its next hop through
// the one below it, and the bottom one reaches the network itself.
func buildTransport(layers []Layer) (layer.ContextDialer, error) {
	var forward layer.ContextDialer
	for i := len(layers) - 1; i >= 0; i-- {
		spec, v, err := layers[i].build()
		if err != nil {
			return nil, err
		}
		f, ok := v.(layer.Factory)
		if !ok {
			return nil, fmt.Errorf("layer %s: registered as a factory but is not one", spec.Name)
		}
		forward = &factoryDialer{f: f, forward: forward, stack: Stack{Layers: layers[i:]}.String()}
	}
	return forward, nil
}

type factoryDialer struct {
	f       layer.Factory
	forward layer.ContextDialer
	stack   string // the factories from this one down, in text form
}

// String returns the text form of the factories this dialer goes
// through, from its own down to the wire ("socks5:addr=p:1080+tcp"). A
// factory that keeps state per path, such as ssh sharing one connection
// per server and path, keys it on its forward dialer's String.
func (d *factoryDialer) String() string { return d.stack }

func (d *factoryDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.f.DialContext(ctx, network, address, d.forward)
}

// A segmentDialer dials within one segment of a stack (the layers one
// hello negotiates): with the connection it returns the key and the
// transcript of the segment's hello, for the filters that bind to them
// (layer.HandshakeFilter). The hello dialers and filterDialer are
// segmentDialers.
type segmentDialer interface {
	dialSegment(ctx context.Context, network, address string) (net.Conn, layer.Handshake, error)
}

type filterDialer struct {
	name string
	f    layer.Filter
	next segmentDialer
}

func (d *filterDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, _, err := d.dialSegment(ctx, network, address)
	return c, err
}

func (d *filterDialer) dialSegment(ctx context.Context, network, address string) (net.Conn, layer.Handshake, error) {
	c, hs, err := d.next.dialSegment(ctx, network, address)
	if err != nil {
		return nil, hs, err
	}
	var fc net.Conn
	if hf, ok := d.f.(layer.HandshakeFilter); ok {
		fc, err = withContext(ctx, c, func() (net.Conn, error) { return hf.ClientHandshake(c, hs) })
	} else {
		fc, err = d.f.Client(c)
	}
	if err != nil {
		c.Close()
		return nil, hs, layerDialErr(ctx, hs.FirstFlight, d.name, network, address, err)
	}
	if ec, ok := fc.(layer.EarlyConn); ok && hs.Early {
		if e, _ := ctx.Value(earlyKey{}).(*earlyDial); e != nil && e.conn == nil {
			e.conn, e.name, e.ff = ec, d.name, hs.FirstFlight
		}
	}
	return fc, hs, nil
}

// layerDialErr is the dial's error for a layer's handshake that failed
// with err: the hello's failure when the layer passed it on (a refusal
// read in its first flight's answer), else the layer's.
func layerDialErr(ctx context.Context, ff layer.FirstFlight, name, network, address string, err error) error {
	if ff, ok := ff.(*firstFlight); ok && ff.err != nil && ctx.Err() == nil {
		return ff.err
	}
	return &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: fmt.Errorf("layer %s: %w", name, err)}
}

// withContext runs a layer's handshake on c within the context's deadline
// (or DefaultHandshakeTimeout), interrupted by its cancellation.
func withContext(ctx context.Context, c net.Conn, handshake func() (net.Conn, error)) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(DefaultHandshakeTimeout))
	}
	stop := netconn.InterruptOnDone(ctx, c)
	fc, err := handshake()
	if !stop() && ctx.Err() != nil {
		if fc != nil {
			fc.Close()
		}
		return nil, fmt.Errorf("handshake: %w", ctx.Err())
	}
	if err != nil {
		return nil, err
	}
	return fc, c.SetDeadline(time.Time{})
}

// helloDialer dials the VLink peer (the destination, or the gateway) and
// runs the handshake on the raw stream.
type helloDialer struct {
	next   layer.ContextDialer
	peer   string // where to connect: the destination or the gateway
	target string // where the gateway forwards; empty for none
	node   string // the dialer's node name; empty for none
	key    []byte // the pre-shared key, or the node's key
	stack  string
	hops   int // the nodes of route layers before the peer
	// peerKey, set when the segment is encrypted, checks the static key
	// the listener announces.
	peerKey PeerKeyCallback
	lookup  bool // the hello is a lookup: see Dialer.LookupHost
	// datagram: the hello opens a datagram session (Hello.Datagram)
	datagram bool
	// carrier, when set, is where the hello of a datagram session that
	// asked for QUIC datagrams leaves their carrier for the dialer.
	carrier *layer.DatagramCarrier
	// member, when set, replaces node and key: the hello carries its
	// certificate, and the accept must carry one it trusts.
	member   *Member
	peerCert PeerCertCallback
	// cc is the congestion control the factories below use, for the
	// listener's side to use too (Hello.CongestionControl); "" for none.
	cc string
	// aeads is the hello's cipher offer (aeadOffer), nil for none.
	aeads []byte
	// first: the segment's bottom layer sends its first message with
	// the hello (firstFlight), where the connection allows it; statics
	// are the keys the Dialer's listeners proved, for it to name.
	first   bool
	statics *staticKeys
	// pinned, set with peerKey, gives the key it pinned for a listener
	// statics do not know yet (Dialer.PinnedKey).
	pinned func(address string) []byte
	// early: the segment is the stack's only one, so the filter at its
	// bottom may wait for the connection's first bytes (DialEarly).
	early bool
}

// congestionOf returns the congestion control a chain of factories sets
// (layer.CongestionControlled), or "".
func congestionOf(d layer.ContextDialer) string {
	for {
		fd, ok := d.(*factoryDialer)
		if !ok {
			return ""
		}
		if cc, ok := fd.f.(layer.CongestionControlled); ok && cc.CongestionControl() != "" {
			return cc.CongestionControl()
		}
		d = fd.forward
	}
}

func (d *helloDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, _, err := d.dialSegment(ctx, network, address)
	return c, err
}

func (d *helloDialer) dialSegment(ctx context.Context, network, _ string) (net.Conn, layer.Handshake, error) {
	c, err := d.next.DialContext(ctx, network, d.peer)
	if err != nil {
		return nil, layer.Handshake{}, err
	}
	node, key := d.node, d.key
	vouched, _ := c.(Vouched)
	if vouched != nil {
		node, key = "", vouched.VouchedKey() // the relay vouched for both ends
	}
	var cert []byte
	if d.member != nil {
		node, key, cert = "", nil, d.member.Cert.Marshal() // the certificate names the node
	}
	var binding []byte
	var carrier layer.DatagramCarrier
	if d.hops == 0 {
		binding = channelBinding(c) // the peer is the channel's other end
		if d.first && vouched == nil && binding == nil && key != nil && cert == nil {
			aead := layer.AEADDefault
			if len(d.aeads) > 0 {
				aead = layer.AEAD(d.aeads[0])
			}
			static := d.statics.get(d.peer) // NKpsk0 with the key the listener proved last time
			if static == nil && d.pinned != nil {
				static = d.pinned(d.peer) // or the one pinned on a first use before
			}
			hello := &message{stack: d.stack, target: d.target, node: node, cc: d.cc, aeads: d.aeads,
				wait: targetWait(ctx, d.target, false, false), first: &firstField{aead: aead, static: static}}
			ff := &firstFlight{d: d, c: c, network: network, hello: hello, key: key}
			hs := layer.Handshake{Key: key, AEAD: aead, PeerStatic: static, FirstFlight: ff}
			if e, _ := ctx.Value(earlyKey{}).(*earlyDial); e != nil && d.early && static != nil && d.statics.takesEarly(d.peer) {
				hs.Early = true
			}
			return c, hs, nil
		}
		if d.datagram && vouched == nil && d.carrier != nil {
			// A quic stream straight to the listener: the datagrams
			// that fit ride QUIC's (Hello.QUICDatagrams).
			carrier = layer.DatagramCarrierOf(c)
		}
	}
	transcript, acc, err := handshakeWithContext(ctx, c, &message{stack: d.stack, target: d.target, node: node, lookup: d.lookup, dgram: d.datagram, qdgram: carrier != nil, cert: cert, cc: d.cc, aeads: d.aeads,
		wait: targetWait(ctx, d.target, d.lookup, d.datagram)}, key, binding)
	if err == nil && carrier != nil {
		*d.carrier = carrier
	}
	if re := (*RefusedError)(nil); d.hops > 0 && errors.As(err, &re) {
		err = &RefusedError{Code: re.Code, Reason: re.Reason, Hop: d.hops + 1, HopAddr: d.peer}
	}
	var static []byte
	if err == nil {
		static = acc.static
	}
	var own layer.KeyPair
	if err == nil && d.member != nil && !d.lookup {
		var pc *nodecert.Certificate
		if pc, err = d.peerCertificate(acc, vouched); err == nil {
			static, own = pc.PublicKey(), d.member.keyPair()
		}
	} else if err == nil && d.peerKey != nil && !d.lookup {
		// A lookup's answer is proven by the key alone: the listener
		// proves its identity in the encryption layer, which no
		// lookup reaches.
		err = d.peerKey(d.peer, static)
	}
	if err != nil {
		c.Close()
		return nil, layer.Handshake{}, &net.OpError{Op: "dial", Net: "vlink", Source: c.LocalAddr(), Addr: addr{network, d.peer}, Err: err}
	}
	if d.lookup {
		return &lookupAnswer{Conn: c, family: acc.family}, layer.Handshake{}, nil
	}
	hs := layer.Handshake{Key: key, Transcript: transcript, Static: own, PeerStatic: static}
	if acc.aeads != nil {
		hs.AEAD = layer.AEAD(acc.aeads[0])
	}
	return c, hs, nil
}

// peerCertificate checks the certificate a member's peer answered with:
// the member's trust accepts it, a node reached through the network is
// the node dialed, and the PeerCert callback agrees.
func (d *helloDialer) peerCertificate(acc *message, vouched Vouched) (*nodecert.Certificate, error) {
	if acc.cert == nil {
		return nil, fmt.Errorf("%w: the listener presented no certificate: it is not a member of this network (vlink serve --cert, Policy.Member)", ErrAuth)
	}
	pc, err := d.member.peer(acc.cert)
	if err != nil {
		return nil, fmt.Errorf("%w: the listener's certificate: %w", ErrAuth, err)
	}
	if vouched != nil && pc.Name() != vouched.VouchedPeer() {
		return nil, fmt.Errorf("%w: the network connected us to %q, whose certificate names %q", ErrAuth, vouched.VouchedPeer(), pc.Name())
	}
	if d.peerCert != nil {
		if err := d.peerCert(d.peer, pc); err != nil {
			return nil, err
		}
	}
	return pc, nil
}

// handshakeWithContext runs the dialer's side of a hello on c, within the
// context's deadline (or DefaultHandshakeTimeout) and interrupted by its
// cancellation, and returns its transcript and the listener's accept
// (see clientHandshake).
func handshakeWithContext(ctx context.Context, c net.Conn, hello *message, key, binding []byte) (transcript []byte, acc *message, err error) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(DefaultHandshakeTimeout))
	}
	stop := netconn.InterruptOnDone(ctx, c)
	transcript, acc, herr := clientHandshake(c, hello, key, binding)
	if !stop() && ctx.Err() != nil {
		return nil, nil, fmt.Errorf("handshake: %w", ctx.Err())
	}
	if dl, ok := ctx.Deadline(); ok && herr != nil && isTimeout(herr) && !time.Now().Before(dl) {
		// The context's deadline, enforced through the connection's.
		return nil, nil, fmt.Errorf("handshake: %w (%w)", context.DeadlineExceeded, herr)
	}
	if herr != nil {
		var re *RefusedError
		if errors.As(herr, &re) {
			return nil, nil, herr
		}
		return nil, nil, fmt.Errorf("handshake: %w", herr)
	}
	return transcript, acc, c.SetDeadline(time.Time{})
}

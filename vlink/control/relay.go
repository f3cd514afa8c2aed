package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// Defaults of RelayConfig.
const (
	DefaultMaxNodes    = 100_000
	DefaultRelayQueue  = 256 << 10
	DefaultMaxBuffered = 256 << 20
	DefaultIdleTimeout = 4 * DefaultKeepAlive
	// recentLimit bounds how many (origin, cooperation) pairs the relay
	// remembers per node to vouch for its forwards; recentTTL is how long.
	recentLimit = 256
	recentTTL   = 2 * time.Minute
)

// RelayConfig configures a relay. Its zero value is usable.
type RelayConfig struct {
	// MaxNodes bounds the nodes registered at once; a node beyond it is
	// refused. Zero means DefaultMaxNodes.
	MaxNodes int
	// MaxQueue bounds the bytes queued toward one node; a message that
	// does not fit is refused to its sender as busy, so one slow node
	// costs the others nothing. Zero means DefaultRelayQueue.
	MaxQueue int
	// MaxBuffered bounds the bytes queued toward all nodes together.
	// Zero means DefaultMaxBuffered.
	MaxBuffered int64
	// IdleTimeout ends a node's connection after that long without a
	// frame; nodes ping every Config.KeepAlive. Zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxRelayed bounds the connections the relay carries, set up or
	// being set up. Each holds at most two kernel pipes' worth of bytes
	// (the relay copies in the kernel), so this bounds what it buffers for
	// them. Zero means DefaultMaxRelayed.
	MaxRelayed int
	// Member, when set, makes the relay a member of a network with an
	// owner (a certificate of kind relay): nodes register with their
	// certificates, which its trust checks, and prove them in the
	// encryption layer; Listen then takes no network key (one network
	// is in one mode: a node of the key mode and a member would not
	// reach each other, members refusing the key the relay hands
	// out). The relay also takes the
	// ends of relayed connections from connections that prove nothing:
	// their token, which only the two nodes and the relay know, is what
	// they prove (a member's end holds no key the relay could check).
	Member *vlink.Member
	// Peers are the other relays of the network (host:port), which this
	// relay links with (links.go), so that a node registered with any of
	// them reaches a node registered with another: they announce their
	// nodes to each other and pass on what concerns them, connections
	// between nodes included, which stay encrypted end to end. The
	// relays of a network link in a full mesh: each is listed by, or
	// lists, every other. Each holds a certificate the owner signed for
	// a relay, and takes only such another's; with no Member there are
	// no peers (every holder of a network key could pass for a relay).
	// A relay also takes links from relays that list it.
	Peers []string
	// Logger receives registrations and refusals. Nil discards them.
	Logger *slog.Logger
}

// Validate reports whether the config is usable.
func (c *RelayConfig) Validate() error {
	if c.MaxNodes < 0 || c.MaxQueue < 0 || c.MaxBuffered < 0 || c.IdleTimeout < 0 || c.MaxRelayed < 0 {
		return errors.New("control: relay: negative limit")
	}
	if c.Member != nil {
		if err := c.Member.Validate(); err != nil {
			return fmt.Errorf("control: relay: %w", err)
		}
		if c.Member.Cert.Kind() != nodecert.KindRelay {
			return fmt.Errorf("control: relay: the certificate of %s is a %s's: a relay needs one signed for a relay (vlink cert sign --relay)", c.Member.Cert.Name(), c.Member.Cert.Kind())
		}
	}
	if len(c.Peers) > 0 && c.Member == nil {
		return errors.New("control: relay: relays link only in a network with an owner, each with a relay's certificate: with a network key, any node could pass for a relay")
	}
	for _, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			return fmt.Errorf("control: relay: peer %q: %w", p, err)
		}
	}
	return nil
}

// A Relay is the rendezvous of a vlink network: it registers nodes under
// the names they proved, keeps the directory of who is online and from
// where, and routes control messages between them. It only serves
// authenticated nodes: see Serve.
type Relay struct {
	cfg    RelayConfig
	log    *slog.Logger
	budget budget

	relayed atomic.Int64 // connections being relayed
	// Counts since the start, for Stats.
	registrations, relayedTotal, relayedBytes atomic.Uint64
	refused                                   [codeLimit]atomic.Uint64 // by code
	logins                                    logins

	mu        sync.Mutex
	nodes     map[string]*peer // registered here
	remote    map[string]*peer // registered with a linked relay
	links     map[string]*link // by the other relay's name
	transit   map[[tokenSize]byte]*transit
	pending   map[[tokenSize]byte]*rendezvous
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // connections in their first frame or relayed
	closed    bool

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	linkOnce  sync.Once // starts the links with Peers
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// peer is a registered node, as the relay holds it: registered here,
// or with the linked relay via.
type peer struct {
	name     string
	via      *link
	cert     *nodecert.Certificate // the certificate it registered with, if a member
	ch       *channel
	observed netip.AddrPort
	since    time.Time

	pending int // rendezvous this node asked for; under Relay.mu

	mu         sync.Mutex
	advertised []netip.AddrPort
	recent     map[voucher]time.Time // lazily made: an idle node holds none
}

// send queues f toward p: on its control connection, or wrapped for
// the relay it is registered with.
func (p *peer) send(f *frame) error {
	if p.via != nil {
		return p.via.ch.trySend(&frame{op: opVia, name: p.name, payload: f.append(nil)})
	}
	return p.ch.trySend(f)
}

// A voucher records that the relay delivered a cooperation's message
// from origin to a node, so that node may forward it on origin's behalf.
type voucher struct {
	origin string
	coop   uint64
}

// NewRelay returns a relay; Serve puts it to work.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxNodes == 0 {
		cfg.MaxNodes = DefaultMaxNodes
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultRelayQueue
	}
	if cfg.MaxBuffered == 0 {
		cfg.MaxBuffered = DefaultMaxBuffered
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxRelayed == 0 {
		cfg.MaxRelayed = DefaultMaxRelayed
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, nodes: map[string]*peer{}, remote: map[string]*peer{}, links: map[string]*link{},
		transit: map[[tokenSize]byte]*transit{}, listeners: map[net.Listener]struct{}{}, pending: map[[tokenSize]byte]*rendezvous{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.budget.max = cfg.MaxBuffered
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.logins.log = slog.New(limitedHandler{r.log.Handler(), &r.logins})
	return r, nil
}

// NodeOf returns the node name a connection accepted by a vlink.Listener
// proved in its hello, or "" for none.
func NodeOf(c net.Conn) string {
	if vc, ok := c.(interface{ Hello() *vlink.Hello }); ok && vc.Hello() != nil {
		return vc.Hello().Node
	}
	return ""
}

// Serve accepts control connections on l until l fails or the relay is
// closed. l must be a *vlink.Listener whose policy holds the network
// key: each connection's hello proved a node's key, and the node is
// registered under the name it proved. A connection that proved no node
// name is closed.
func (r *Relay) Serve(l net.Listener) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return net.ErrClosed
	}
	r.listeners[l] = struct{}{}
	r.mu.Unlock()
	r.linkOnce.Do(func() {
		// Once a listener is up: a link names the port it serves on.
		for _, addr := range r.cfg.Peers {
			r.wg.Add(1)
			go r.keepLinked(addr)
		}
		if r.cfg.Member != nil {
			r.wg.Add(1)
			go r.recheckEvery(recheckInterval)
		}
	})
	defer func() {
		r.mu.Lock()
		delete(r.listeners, l)
		r.mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed {
				return net.ErrClosed
			}
			return err
		}
		name := NodeOf(c)
		if name == "" && r.cfg.Member != nil {
			// Only the end of a relayed connection, proven by its token.
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.serveConn(c, "", false)
			}()
			continue
		}
		if cert := certOf(c); cert != nil && cert.Kind() == nodecert.KindRelay && r.cfg.Member != nil && encrypted(c) {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				if cert.Name() == r.cfg.Member.Cert.Name() {
					r.logins.log.Info("control: relay: refused a link from a relay with this relay's own name", "remote", c.RemoteAddr().String())
					r.logins.failed(LoginRefused)
					c.Close()
					return
				}
				r.serveLink(c, cert, "")
			}()
			continue
		}
		if cert := certOf(c); cert != nil && cert.Kind() != nodecert.KindNode {
			r.logins.log.Info("control: relay: refused a certificate that is not a node's", "cert", cert.Name(), "kind", cert.Kind().String(), "remote", c.RemoteAddr().String())
			r.logins.failed(LoginRefused)
			c.Close()
			continue
		}
		if name == "" {
			r.logins.log.Info("control: relay: refused a connection that proved no node name", "remote", c.RemoteAddr().String())
			r.logins.failed(LoginAuthRequired)
			c.Close()
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serveConn(c, name, encrypted(c))
		}()
	}
}

// certOf returns the certificate c's hello proved, if any.
func certOf(c net.Conn) *nodecert.Certificate {
	if vc, ok := c.(interface{ Hello() *vlink.Hello }); ok && vc.Hello() != nil {
		return vc.Hello().Cert
	}
	return nil
}

// encrypted reports whether c's hello holds the encryption layer.
func encrypted(c net.Conn) bool {
	if vc, ok := c.(interface{ Hello() *vlink.Hello }); ok && vc.Hello() != nil {
		for _, l := range vc.Hello().Stack.Layers {
			if l.Name == vlink.EncryptionLayer {
				return true
			}
		}
	}
	return false
}

// ServeConn serves one connection of a node already authenticated as
// name, and encrypted, until it ends: a control connection, or one end
// of a relayed connection. Serve calls it; a program with its own
// authentication may too.
func (r *Relay) ServeConn(c net.Conn, name string) { r.serveConn(c, name, true) }

func (r *Relay) serveConn(c net.Conn, name string, encrypted bool) {
	if !r.track(c) {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Now().Add(vlink.DefaultHandshakeTimeout))
	f, err := readFrame(c)
	if err == nil && f.op == opAttach {
		// A relayed connection's end: its bytes are the two nodes'
		// business, encrypted end to end by them. attach owns c now.
		c.SetReadDeadline(time.Time{})
		r.attach(c, name, f.token)
		return
	}
	defer r.untrack(c)
	reason := LoginMalformed
	switch {
	case err == nil && name == "":
		err = fmt.Errorf("a connection that proves no node name can only attach, not %s", f.op)
		reason = LoginAuthRequired
	case err != nil && !errors.Is(err, ErrMalformed):
		reason = LoginFailed
	case err == nil && f.op != opAdvertise:
		err = fmt.Errorf("%w: a node opens with advertise or attach, not %s", ErrMalformed, f.op)
	case err == nil && !encrypted:
		err = fmt.Errorf("a control connection must be encrypted: its stack lacks %s", vlink.EncryptionLayer)
		reason = LoginPlaintext
	}
	if err != nil {
		r.logins.log.Info("control: relay: no registration", "node", name, "remote", c.RemoteAddr().String(), "reason", reason, "err", err)
		r.logins.failed(reason)
		c.Close()
		return
	}
	p := &peer{name: name, cert: certOf(c), ch: newChannel(c, r.cfg.MaxQueue, &r.budget), since: time.Now(), advertised: f.addrs}
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		p.observed = ta.AddrPort()
		p.observed = netip.AddrPortFrom(p.observed.Addr().Unmap(), p.observed.Port())
	}
	if err := r.register(p); err != nil {
		r.log.Info("control: relay: refused a node", "node", name, "remote", c.RemoteAddr().String(), "err", err)
		// Tell the node why before closing: it backs off and retries.
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write((&frame{op: opError, code: CodeBusy, name: name, reason: err.Error()}).append(nil))
		p.ch.fail(err)
		return
	}
	defer r.unregister(p)
	if p.observed.IsValid() {
		p.ch.trySend(&frame{op: opWelcome, addrs: []netip.AddrPort{p.observed}})
	} else {
		p.ch.trySend(&frame{op: opWelcome, addrs: []netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), 1)}})
	}
	for {
		c.SetReadDeadline(time.Now().Add(r.cfg.IdleTimeout))
		f, err := readFrame(c)
		if err != nil {
			if cerr := p.ch.Err(); cerr != nil {
				err = cerr
			}
			r.log.Info("control: relay: node gone", "node", name, "err", err)
			p.ch.fail(err)
			return
		}
		if err := r.handle(p, f); err != nil {
			r.log.Info("control: relay: dropped a node", "node", name, "err", err)
			p.ch.fail(err)
			return
		}
	}
}

// errReplaced ends a node's older connection when it registers again
// (a reconnect that beat the old connection's timeout).
var errReplaced = errors.New("control: relay: the node registered again on another connection")

func (r *Relay) register(p *peer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return net.ErrClosed
	}
	old := r.nodes[p.name]
	if old == nil && len(r.nodes) >= r.cfg.MaxNodes {
		return fmt.Errorf("%w: %d nodes registered, the most this relay takes", ErrBusy, len(r.nodes))
	}
	if old != nil && old.cert != nil && (p.cert == nil || !bytes.Equal(old.cert.PublicKey(), p.cert.PublicKey())) {
		// A name is bound to the key that holds it while its holder
		// lives: another key waits until the relay has seen it go (its
		// connection closed, or silent for IdleTimeout).
		return fmt.Errorf("%w: node %s is registered, and live, with another key (certificate %s, from %s); a node with this name registers again once that one is gone", ErrBusy, p.name, old.cert.Fingerprint(), old.observed)
	}
	if old != nil {
		old.ch.fail(errReplaced)
	}
	r.nodes[p.name] = p
	r.announce(joined(p))
	r.registrations.Add(1)
	r.log.Info("control: relay: registered", "node", p.name, "seen as", p.observed.String())
	return nil
}

// ErrCertRefused is what a node whose certificate the relay's trust no
// longer accepts is dropped with (see Recheck).
var ErrCertRefused = errors.New("control: relay: the node's certificate is no longer accepted (revoked or expired)")

// Recheck drops the registered nodes, and the links with other relays,
// whose certificates the relay's trust no longer accepts, after
// RelayConfig.Member.Trust.Reload read a new revocation list, or as
// certificates expire, and returns how many nodes it dropped. A node or
// relay dropped so cannot come back: its certificate is refused at the
// hello.
func (r *Relay) Recheck() int {
	if r.cfg.Member == nil {
		return 0
	}
	now := time.Now()
	var drop []*peer
	var links []*link
	r.mu.Lock()
	for _, p := range r.nodes {
		if p.cert != nil && r.cfg.Member.Trust.Check(p.cert, now) != nil {
			drop = append(drop, p)
		}
	}
	for _, l := range r.links {
		if r.cfg.Member.Trust.Check(l.cert, now) != nil {
			links = append(links, l)
		}
	}
	r.mu.Unlock()
	for _, l := range links {
		r.log.Info("control: relay: dropped the link with a relay whose certificate is no longer accepted", "relay", l.name, "cert", l.cert.Fingerprint())
		l.ch.fail(ErrCertRefused)
	}
	for _, p := range drop {
		r.log.Info("control: relay: dropped a node whose certificate is no longer accepted", "node", p.name, "cert", p.cert.Fingerprint())
		p.ch.fail(ErrCertRefused)
	}
	return len(drop)
}

// recheckInterval is how often a relay with an owner drops the nodes and
// relays whose certificates expired: within it of their expiry.
var recheckInterval = time.Minute

// recheckEvery runs Recheck every d until the relay closes.
func (r *Relay) recheckEvery(d time.Duration) {
	defer r.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.Recheck()
		case <-r.ctx.Done():
			return
		}
	}
}

// unregister removes p from the directory and ends the connections
// being set up to or from it: the node at the other end learns at once
// rather than at the set-up's timeout, and what it holds for them is
// freed.
func (r *Relay) unregister(p *peer) {
	r.mu.Lock()
	if p.via == nil && r.nodes[p.name] == p {
		delete(r.nodes, p.name)
		r.announce(&frame{op: opLeft, name: p.name})
	}
	var gone []*rendezvous
	for _, rv := range r.pending {
		if rv.a == p || rv.b == p {
			gone = append(gone, rv)
		}
	}
	r.mu.Unlock()
	for _, rv := range gone {
		if r.take(rv.token) == nil {
			continue // taken meanwhile
		}
		if rv.bConn != nil {
			r.drop(rv.bConn)
		}
		if rv.b == p {
			rv.a.send(&frame{op: opError, coop: rv.coop, code: CodeNoNode, name: p.name, reason: "it went offline"})
		}
	}
}

// lookup returns the node called name, registered here or else with a
// linked relay, or nil.
func (r *Relay) lookup(name string) *peer {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.nodes[name]; p != nil {
		return p
	}
	return r.remote[name]
}

// handle acts on one frame from node p. An error ends p's connection:
// only a frame no node sends does that.
func (r *Relay) handle(p *peer, f *frame) error {
	switch f.op {
	case opPing:
		p.ch.trySend(&frame{op: opPong, payload: f.payload})
	case opPong:
	case opSend:
		r.route(p, f, p.name, "")
	case opForward:
		if !p.vouched(f.name2, f.coop) {
			r.refuse(p, f, CodeForbidden, "forwarding on behalf of "+f.name2+", who sent this node no such message")
			return nil
		}
		r.route(p, f, f.name2, p.name)
	case opLookup:
		ans := &frame{op: opPeer, coop: f.coop, name: f.name}
		if q := r.lookup(f.name); q != nil {
			ans.online = true
			ans.addrs = q.addrs()
		}
		p.ch.trySend(ans)
	case opDial:
		r.dial(p, f)
	case opDecline:
		r.decline(p, f)
	case opPunch:
		r.punch(p, f)
	case opSync:
		r.sync(p, f)
	case opAdvertise:
		p.mu.Lock()
		p.advertised = f.addrs
		p.mu.Unlock()
		r.mu.Lock()
		if r.nodes[p.name] == p {
			r.announce(joined(p))
		}
		r.mu.Unlock()
	default:
		return fmt.Errorf("%w: a node does not send %s", ErrMalformed, f.op)
	}
	return nil
}

// route delivers a message from p to its destination, as from origin
// (via the forwarder, if any), or tells p why not.
func (r *Relay) route(p *peer, f *frame, origin, via string) {
	q := r.lookup(f.name)
	if q == nil {
		r.refuse(p, f, CodeNoNode, "")
		return
	}
	d := &frame{op: opDeliver, typ: f.typ, coop: f.coop, name: origin, name2: via, payload: f.payload}
	if err := q.send(d); err != nil {
		r.refuse(p, f, CodeBusy, "its queue is full")
		return
	}
	if f.coop != 0 && q.via == nil {
		q.vouch(origin, f.coop) // the relay q is registered with vouches for its own
	}
}

// refuse tells p that its message to f.name was not delivered. Only a
// message within a cooperation has someone waiting to hear it.
func (r *Relay) refuse(p *peer, f *frame, code Code, reason string) {
	if code < codeLimit {
		r.refused[code].Add(1)
	}
	if f.coop != 0 {
		p.ch.trySend(&frame{op: opError, coop: f.coop, code: code, name: f.name, reason: reason})
	}
}

func (p *peer) addrs() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]netip.AddrPort, 0, 1+len(p.advertised))
	if p.observed.IsValid() {
		out = append(out, p.observed)
	}
	for _, a := range p.advertised {
		if len(out) == maxAddrs {
			break
		}
		out = append(out, a)
	}
	return out
}

func (p *peer) vouch(origin string, coop uint64) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.recent == nil {
		p.recent = map[voucher]time.Time{}
	}
	if len(p.recent) >= recentLimit {
		var oldest voucher
		var at time.Time
		for v, t := range p.recent {
			if now.Sub(t) > recentTTL {
				delete(p.recent, v)
			} else if at.IsZero() || t.Before(at) {
				oldest, at = v, t
			}
		}
		if len(p.recent) >= recentLimit {
			delete(p.recent, oldest)
		}
	}
	p.recent[voucher{origin, coop}] = now
}

func (p *peer) vouched(origin string, coop uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.recent[voucher{origin, coop}]
	return ok && coop != 0 && time.Since(t) <= recentTTL
}

// track records a connection Close must close, unless the relay is
// closed already.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	if r.conns == nil {
		r.conns = map[net.Conn]struct{}{}
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

// drop closes a tracked connection.
func (r *Relay) drop(c net.Conn) {
	c.Close()
	r.untrack(c)
}

// Relayed returns how many connections between nodes the relay carries.
func (r *Relay) Relayed() int { return int(r.relayed.Load()) }

// RelayStats are a relay's figures, for a metrics endpoint.
type RelayStats struct {
	Nodes         int    // registered now
	Peers         int    // relays linked now (RelayConfig.Peers)
	RemoteNodes   int    // registered with the linked relays now, as they announced them
	Relayed       int    // connections between nodes carried now
	Registrations uint64 // registrations since the start, again after a reconnect included
	// RelayedTotal counts the connections between nodes carried since
	// the start, RelayedBytes their bytes both ways, as each ended.
	RelayedTotal, RelayedBytes uint64
	// Refused counts the messages and connections the relay refused,
	// by reason (a Code's String: "no such node", "busy", "forbidden",
	// "timed out": the node did not answer a connection's set-up).
	Refused map[string]uint64
	// FailedLogins counts the connections refused before a node was
	// registered or a relayed connection attached, by reason (Login*
	// constants): wrong keys, scans, plaintext, cut handshakes.
	FailedLogins map[string]uint64
}

// Stats returns the relay's figures so far.
func (r *Relay) Stats() RelayStats {
	r.mu.Lock()
	nodes, peers, remote := len(r.nodes), len(r.links), len(r.remote)
	r.mu.Unlock()
	s := RelayStats{Nodes: nodes, Peers: peers, RemoteNodes: remote, Relayed: r.Relayed(), Registrations: r.registrations.Load(),
		RelayedTotal: r.relayedTotal.Load(), RelayedBytes: r.relayedBytes.Load(), Refused: map[string]uint64{},
		FailedLogins: r.logins.snapshot()}
	for _, c := range []Code{CodeNoNode, CodeBusy, CodeForbidden, CodeTimeout} {
		s.Refused[c.String()] = r.refused[c].Load()
	}
	return s
}

// A NodeInfo describes a registered node.
type NodeInfo struct {
	Name       string
	Observed   netip.AddrPort
	Advertised []netip.AddrPort
	Since      time.Time
}

// Nodes returns the registered nodes, sorted by name.
func (r *Relay) Nodes() []NodeInfo {
	r.mu.Lock()
	out := make([]NodeInfo, 0, len(r.nodes))
	for _, p := range r.nodes {
		p.mu.Lock()
		out = append(out, NodeInfo{Name: p.name, Observed: p.observed, Advertised: append([]netip.AddrPort(nil), p.advertised...), Since: p.since})
		p.mu.Unlock()
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Close closes the listeners Serve runs on and every node's connection,
// and waits for them.
func (r *Relay) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.cancel()
		for l := range r.listeners {
			l.Close()
		}
		nodes := r.nodes
		r.nodes = map[string]*peer{}
		for c := range r.conns {
			netconn.Abort(c) // a relayed connection cut by the relay's end is not a clean end
		}
		for _, rv := range r.pending {
			rv.expiry.Stop()
		}
		for _, t := range r.transit {
			t.expiry.Stop()
		}
		r.mu.Unlock()
		for _, p := range nodes {
			p.ch.fail(net.ErrClosed)
		}
	})
	r.wg.Wait()
	return nil
}

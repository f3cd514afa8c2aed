package control

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"sync"
	"time"

	_ "github.com/vlink-dev/vlink/factories/tcp"    // relays are reached over TCP
	_ "github.com/vlink-dev/vlink/filters/identity" // a relayed connection's hello to the relay
	_ "github.com/vlink-dev/vlink/filters/noise"    // the control channel is always encrypted
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// Defaults of Config and RelayConfig.
const (
	DefaultKeepAlive   = 15 * time.Second
	DefaultMaxHandlers = 64
	DefaultNodeQueue   = 1 << 20
	// maxBackoff caps the wait between reconnects, so that a node is
	// back within about that long of its relay's return, however long
	// it was away (jitter spreads the nodes over the second half).
	maxBackoff = 8 * time.Second
	// firstRetry is the wait after losing a relay that was up a while:
	// with several relays, the node is registered with the next within
	// about that long.
	firstRetry = 500 * time.Millisecond
)

// Config configures a node. Relays are required, and Name and Key, or
// Member.
type Config struct {
	// Name is the node's name, which the relay binds to Key. With a
	// Member, empty means its certificate's name, the only one allowed.
	Name string
	// Key is the node's key: vlink.NodeKey(network key, Name), or the
	// network key's holder's own. Nil with a Member.
	Key []byte
	// Member makes the node a member of a network with an owner: it
	// registers with its certificate, proves it with its own key, and
	// takes the relay's certificate only if the owner signed it for a
	// relay. The relay then holds no key of the node's, nor of its
	// connections: those between members are secured end to end by their
	// certificates' keys (vlink.Dialer.Member, vlink.Policy.Member, which
	// the node's dialers and listeners must be given too).
	Member *vlink.Member
	// Relays are the relays' host:port, tried in order; the node keeps
	// one control connection, to the first that answers, and moves on
	// down the list when it fails. Relays linked with each other
	// (RelayConfig.Peers) are one network: the node is reached through
	// whichever it is registered with.
	Relays []string
	// Dialer reaches a relay. Nil means a vlink.Dialer with the noise
	// stack proving Key as Name: the channel is always authenticated and
	// encrypted. A custom dialer (through a SOCKS proxy, say) must do
	// the same.
	Dialer layer.ContextDialer
	// KeepAlive is how often the node pings the relay; three silent
	// intervals end the connection and the node reconnects. Zero means
	// DefaultKeepAlive.
	KeepAlive time.Duration
	// MaxHandlers bounds the handlers running at once; a message
	// arriving when all are busy waits, and so does the channel behind
	// it. Zero means DefaultMaxHandlers.
	MaxHandlers int
	// MaxQueue bounds the bytes queued toward the relay; Send waits for
	// room. Zero means DefaultNodeQueue.
	MaxQueue int
	// Advertise lists the addresses the node accepts connections on,
	// published in the relay's directory (for reverse connections).
	Advertise []netip.AddrPort
	// Logger receives connection events. Nil discards them.
	Logger *slog.Logger
	// Handlers are installed before the node registers, so that no
	// message of their types, sent the moment the node is seen online,
	// arrives before its handler. Handle after Connect works too, but
	// what arrives before it waits in a bounded backlog (see Handle):
	// more than that, and the oldest are lost.
	Handlers map[Type]Handler
}

// Validate reports whether the config is usable.
func (c *Config) Validate() error {
	if c.Member != nil {
		if err := c.Member.Validate(); err != nil {
			return fmt.Errorf("control: %w", err)
		}
		switch cert := c.Member.Cert; {
		case c.Key != nil:
			return errors.New("control: a node with a certificate (Member) proves no key: set Key or Member, not both")
		case c.Name != "" && c.Name != cert.Name():
			return fmt.Errorf("control: the node is called %q and its certificate names %q", c.Name, cert.Name())
		case cert.Kind() != nodecert.KindNode:
			return fmt.Errorf("control: the certificate of %s is a %s's, and a node needs a node's", cert.Name(), cert.Kind())
		}
	} else {
		if err := checkName(c.Name); err != nil {
			return err
		}
		if len(c.Key) < vlink.MinKeySize {
			return fmt.Errorf("control: the node's key is %d bytes, want at least %d (vlink.NodeKey)", len(c.Key), vlink.MinKeySize)
		}
	}
	if len(c.Relays) == 0 {
		return errors.New("control: no relay to connect to")
	}
	for _, r := range c.Relays {
		if _, _, err := net.SplitHostPort(r); err != nil {
			return fmt.Errorf("control: relay %q: %w", r, err)
		}
	}
	if len(c.Advertise) > maxAddrs {
		return fmt.Errorf("control: %d addresses to advertise, at most %d", len(c.Advertise), maxAddrs)
	}
	if c.KeepAlive < 0 || c.MaxHandlers < 0 || c.MaxQueue < 0 {
		return errors.New("control: negative KeepAlive, MaxHandlers or MaxQueue")
	}
	return nil
}

// A Handler handles a message of the type it was registered for. It runs
// in a goroutine of its own, may take as long as it needs and may send,
// reply and forward; the message is its own.
type Handler func(m *Message)

// A Node is a program's end of the control channel: it keeps one
// connection to a relay, reconnecting with backoff when it fails, and
// delivers the messages that arrive to handlers and cooperations.
type Node struct {
	cfg    Config
	dialer layer.ContextDialer
	log    *slog.Logger
	sem    chan struct{} // handler slots

	mu        sync.Mutex
	handlers  map[Type]Handler
	held      backlog // messages of types with no handler yet
	coops     map[uint64]*Cooperation
	ch        *channel      // the current connection, nil while disconnected
	connected chan struct{} // closed while ch is set
	observed  netip.AddrPort
	local     netip.AddrPort // where the control connection left from, if TCP
	relay     string         // the relay registered with
	listener  *listener      // where connections from other nodes go; nil for none
	// reversePorts are the ports ServeReverse accepts on; reverse maps
	// the token of each dial in progress to where its reverse connection
	// goes.
	reversePorts []uint16
	reverse      map[[tokenSize]byte]*reverseWait
	// syncs maps the token of each offer being spliced to where its
	// dialer's sync goes.
	syncs map[[tokenSize]byte]chan struct{}
	// learned is the path the last dial to each node took (learned.go).
	learned map[string]learnedPath
	err     error // why the last connection attempt or connection failed

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// Connect starts a node and waits, within ctx, until a relay has
// registered it, trying again while no relay answers (a refusal, such as
// a wrong key, ends it at once). From then on the node reconnects by
// itself until Close.
func Connect(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Member != nil {
		cfg.Name = cfg.Member.Cert.Name()
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.MaxHandlers == 0 {
		cfg.MaxHandlers = DefaultMaxHandlers
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = DefaultNodeQueue
	}
	n := &Node{
		cfg:       cfg,
		dialer:    cfg.Dialer,
		log:       cfg.Logger,
		sem:       make(chan struct{}, cfg.MaxHandlers),
		handlers:  map[Type]Handler{},
		held:      backlog{draining: map[Type]chan struct{}{}},
		coops:     map[uint64]*Cooperation{},
		reverse:   map[[tokenSize]byte]*reverseWait{},
		syncs:     map[[tokenSize]byte]chan struct{}{},
		learned:   map[string]learnedPath{},
		connected: make(chan struct{}),
	}
	for t, h := range cfg.Handlers {
		if h != nil {
			n.handlers[t] = h
		}
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.dialer == nil {
		n.dialer = RelayDialer(cfg, nil)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	// A relay starting at the same time as its nodes is waited for; a
	// relay that refuses the node, or cannot prove it is the relay, is
	// not.
	var ch *channel
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		var err error
		if ch, err = n.connect(ctx); err == nil {
			break
		}
		if errors.Is(err, vlink.ErrRefused) || errors.Is(err, vlink.ErrAuth) || !sleep(ctx, backoff) {
			n.cancel()
			return nil, err
		}
	}
	n.wg.Add(1)
	go n.run(ch)
	return n, nil
}

// RelayDialer returns the dialer a node of cfg reaches its relay with
// (Config.Dialer's default): the encryption layer over factories (a
// stack's, --relay-stack's; none: TCP), proving cfg's node key or
// certificate, and with a certificate, taking only a relay's.
func RelayDialer(cfg Config, factories []vlink.Layer) *vlink.Dialer {
	stack := vlink.MustParse(vlink.EncryptionLayer) // over TCP
	if len(factories) > 0 {
		stack = vlink.Stack{Layers: append([]vlink.Layer{{Name: vlink.EncryptionLayer}}, factories...)}
	}
	if cfg.Member != nil {
		return &vlink.Dialer{Stack: stack, Member: cfg.Member, PeerCert: relayOnly}
	}
	return &vlink.Dialer{Stack: stack, Key: cfg.Key, Node: cfg.Name}
}

// relayOnly takes only a certificate the owner signed for a relay, so no
// node of the network can pass for the relay.
func relayOnly(address string, c *nodecert.Certificate) error {
	if c.Kind() != nodecert.KindRelay {
		return fmt.Errorf("%w: %s presented the certificate of %s, a %s: not a relay of this network", vlink.ErrAuth, address, c.Name(), c.Kind())
	}
	return nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Observed returns the address the relay last saw this node connect
// from: its address beyond any NAT on the way.
func (n *Node) Observed() netip.AddrPort {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.observed
}

// Handle registers h for messages of type t, replacing any handler it
// had; a nil h removes it.
//
// A message of a type with no handler, which no cooperation waits for,
// is kept for the handler to come, as a socket's receive buffer keeps
// what the program has not read yet: Handle after Connect misses nothing
// that arrived in between. h gets the kept messages of type t first, in
// the order they arrived, then the new ones. The backlog is bounded, for
// all types together, to 1024 messages, 1 MiB (payloads, names and some
// overhead) and one minute's wait; beyond that the oldest are dropped,
// and logged. Config.Handlers leaves no such window.
func (n *Node) Handle(t Type, h Handler) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h == nil {
		delete(n.handlers, t)
		return
	}
	n.handlers[t] = h
	if n.held.draining[t] != nil || !n.held.has(t) || n.ctx.Err() != nil {
		return // nothing kept, or the drain under way takes h
	}
	// In a goroutine: Handle may be called from a handler, holding the
	// slot the kept messages would wait for.
	done := make(chan struct{})
	n.held.draining[t] = done
	n.wg.Add(1)
	go n.drain(t, done)
}

// drain dispatches the kept messages of type t, in order, to its
// handler, until none is left, the handler is removed or the node
// closes; done is closed then.
func (n *Node) drain(t Type, done chan struct{}) {
	defer n.wg.Done()
	defer func() {
		n.mu.Lock()
		delete(n.held.draining, t)
		n.mu.Unlock()
		close(done)
	}()
	for {
		now := time.Now()
		n.mu.Lock()
		h := n.handlers[t]
		var m *Message
		if h != nil {
			m = n.held.take(t, now)
		}
		k, total := n.held.toLog(now)
		n.mu.Unlock()
		n.logDropped(k, total)
		if m == nil || !n.dispatch(h, m) {
			return
		}
	}
}

// logDropped logs k messages dropped from the backlog, total since the
// start; the backlog spaces the lines (heldLogEvery).
func (n *Node) logDropped(k int, total uint64) {
	if k > 0 {
		n.log.Warn("control: dropped messages no handler took (backlog full, or kept too long)",
			"node", n.cfg.Name, "dropped", k, "total", total)
	}
}

// Send sends a message to the named node. It returns once the message is
// queued on the control connection, waiting within ctx for a connection
// (while the node reconnects) and for room in the queue. The payload may
// be reused when Send returns. A node that is not online is reported to
// a cooperation waiting for its answer, not here: use a [Cooperation] to
// learn whether a message arrived.
func (n *Node) Send(ctx context.Context, to string, t Type, payload []byte) error {
	if err := checkName(to); err != nil {
		return err
	}
	return n.send(ctx, &frame{op: opSend, typ: t, name: to, payload: payload})
}

func (n *Node) send(ctx context.Context, f *frame) error {
	_, err := n.sendOn(ctx, f)
	return err
}

// sendOn sends f and returns the connection it was queued on.
func (n *Node) sendOn(ctx context.Context, f *frame) (*channel, error) {
	if (f.op == opSend || f.op == opForward) && f.typ == 0 {
		return nil, errors.New("control: message type 0 is not a type")
	}
	if len(f.payload) > MaxPayload {
		return nil, fmt.Errorf("control: payload of %d bytes exceeds %d", len(f.payload), MaxPayload)
	}
	for {
		ch, err := n.channel(ctx)
		if err != nil {
			return nil, err
		}
		err = ch.send(ctx, f)
		if n.ctx.Err() != nil {
			return nil, net.ErrClosed
		}
		if err == nil || ctx.Err() != nil {
			return ch, err
		}
		// The connection failed under us: wait for the next one.
	}
}

// channel returns the current connection, waiting within ctx for one.
func (n *Node) channel(ctx context.Context) (*channel, error) {
	for {
		n.mu.Lock()
		ch, connected := n.ch, n.connected
		n.mu.Unlock()
		if n.ctx.Err() != nil {
			return nil, net.ErrClosed
		}
		if ch != nil && ch.Err() == nil {
			return ch, nil
		}
		select {
		case <-connected:
		case <-ctx.Done():
			n.mu.Lock()
			last := n.err
			n.mu.Unlock()
			if last != nil {
				return nil, fmt.Errorf("control: not connected to a relay (%v): %w", last, ctx.Err())
			}
			return nil, fmt.Errorf("control: not connected to a relay: %w", ctx.Err())
		case <-n.ctx.Done():
			return nil, net.ErrClosed
		}
	}
}

// closeLinger bounds how long Close waits for what was sent to be
// written.
const closeLinger = time.Second

// Close closes the control connection and stops reconnecting. As a
// socket's close, it first gives the messages and replies already sent
// up to closeLinger to be written to the relay, so that a node's last
// reply before it leaves is not lost. Waiting cooperations fail with
// net.ErrClosed; handlers already running finish.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.cancel()
		n.mu.Lock()
		ch := n.ch
		coops := n.coops
		l := n.listener
		n.coops = map[uint64]*Cooperation{}
		n.mu.Unlock()
		if ch != nil {
			ch.flush(closeLinger)
			ch.fail(net.ErrClosed)
		}
		if l != nil {
			l.Close()
		}
		for _, c := range coops {
			c.finish(net.ErrClosed)
		}
	})
	n.wg.Wait()
	return nil
}

// connect tries each relay in turn until one registers the node.
func (n *Node) connect(ctx context.Context) (*channel, error) {
	var errs []error
	for _, relay := range n.cfg.Relays {
		ch, err := n.register(ctx, relay)
		if err == nil {
			return ch, nil
		}
		errs = append(errs, fmt.Errorf("relay %s: %w", relay, err))
		if ctx.Err() != nil {
			break
		}
	}
	err := errors.Join(errs...)
	n.mu.Lock()
	n.err = err
	n.mu.Unlock()
	return nil, fmt.Errorf("control: node %s: %w", n.cfg.Name, err)
}

// register dials one relay, advertises and waits for the welcome.
func (n *Node) register(ctx context.Context, relay string) (*channel, error) {
	c, err := n.dialer.DialContext(ctx, "tcp", relay)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	} else {
		c.SetReadDeadline(time.Now().Add(vlink.DefaultHandshakeTimeout))
	}
	ch := newChannel(c, n.cfg.MaxQueue, nil)
	// The first frame registers the node with its addresses, so the
	// directory has them once the welcome is back.
	ch.trySend(&frame{op: opAdvertise, addrs: n.cfg.Advertise})
	f, err := readFrame(c)
	if err == nil && f.op == opError {
		err = &DeliveryError{To: f.name, Code: f.code, Reason: f.reason}
	}
	if err == nil && f.op != opWelcome {
		err = fmt.Errorf("%w: the relay opened with %s, want welcome", ErrMalformed, f.op)
	}
	if err == nil && len(f.addrs) != 1 {
		err = fmt.Errorf("%w: a welcome names %d addresses, want 1", ErrMalformed, len(f.addrs))
	}
	if err != nil {
		ch.fail(err)
		return nil, fmt.Errorf("waiting for the relay's welcome: %w", err)
	}
	n.mu.Lock()
	n.ch = ch
	n.relay = relay
	n.observed = f.addrs[0]
	n.local = netip.AddrPort{}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		n.local = unmap(ta.AddrPort())
	}
	n.err = nil
	close(n.connected)
	n.mu.Unlock()
	n.log.Info("control: registered", "node", n.cfg.Name, "relay", relay, "seen as", f.addrs[0].String())
	return ch, nil
}

// run serves the current connection and, when it ends, reconnects with
// backoff until Close.
func (n *Node) run(ch *channel) {
	defer n.wg.Done()
	backoff := firstRetry
	for {
		start := time.Now()
		err := n.serve(ch)
		n.mu.Lock()
		n.ch = nil
		n.connected = make(chan struct{})
		n.err = err
		var lost []*Cooperation
		for _, c := range n.coops {
			lost = append(lost, c)
		}
		n.mu.Unlock()
		// What went out on the lost connection may not have arrived, and
		// its replies cannot come back on it: say so now rather than at
		// the caller's timeout.
		for _, c := range lost {
			c.lost(ch, err)
		}
		if n.ctx.Err() != nil {
			return
		}
		n.log.Warn("control: connection to the relay lost; reconnecting", "node", n.cfg.Name, "err", err)
		if time.Since(start) > maxBackoff {
			backoff = firstRetry // it was up for a while: start over
		}
		for {
			if !sleep(n.ctx, jitter(backoff)) {
				return
			}
			backoff = min(2*backoff, maxBackoff)
			ctx, cancel := context.WithTimeout(n.ctx, vlink.DefaultHandshakeTimeout)
			var cerr error
			ch, cerr = n.connect(ctx)
			cancel()
			if cerr == nil {
				break
			}
			if n.ctx.Err() != nil {
				return
			}
			n.log.Warn("control: reconnect failed", "node", n.cfg.Name, "err", cerr, "retry in", backoff)
		}
	}
}

// serve reads one connection's frames until it fails.
func (n *Node) serve(ch *channel) error {
	stop := make(chan struct{})
	defer close(stop)
	go n.ping(ch, stop)
	idle := 3 * n.cfg.KeepAlive
	for {
		ch.c.SetReadDeadline(time.Now().Add(idle))
		f, err := readFrame(ch.c)
		if err != nil {
			if cerr := ch.Err(); cerr != nil {
				err = cerr
			}
			ch.fail(err)
			return err
		}
		switch f.op {
		case opPing:
			ch.trySend(&frame{op: opPong, payload: f.payload})
		case opPong, opWelcome:
		case opDeliver:
			n.deliver(&Message{From: f.name, Via: f.name2, Type: f.typ, Payload: f.payload, coop: f.coop, node: n})
		case opError:
			n.undeliverable(f)
		case opOffer:
			n.offer(ch, f)
		case opPunch:
			n.punched(f)
		case opSync:
			n.synced(f)
		case opReady:
			n.deliver(&Message{Type: typeReady, coop: f.coop, node: n, ready: f})
		case opPeer:
			n.deliver(&Message{From: f.name, Type: typePeer, coop: f.coop, node: n, peer: &Peer{Name: f.name, Online: f.online, Addrs: f.addrs}})
		default:
			err := fmt.Errorf("%w: a relay does not send %s", ErrMalformed, f.op)
			ch.fail(err)
			return err
		}
	}
}

// ping keeps the connection alive, and finds it dead, by pinging.
func (n *Node) ping(ch *channel, stop <-chan struct{}) {
	t := time.NewTicker(n.cfg.KeepAlive)
	defer t.Stop()
	var b [pingSize]byte
	for {
		select {
		case <-t.C:
			binary.BigEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
			ch.trySend(&frame{op: opPing, payload: b[:]})
		case <-stop:
			return
		}
	}
}

// deliver hands m to the cooperation it answers, or to its handler.
func (n *Node) deliver(m *Message) {
	if (m.Type == typePeer && m.peer == nil) || (m.Type == typeReady && m.ready == nil) {
		return // a node cannot pose as the relay
	}
	n.mu.Lock()
	c := n.coops[m.coop]
	n.mu.Unlock()
	if m.coop != 0 && c != nil && c.offer(m) {
		return
	}
	if m.peer != nil || m.ready != nil {
		return // the relay's answer to a request nobody waits for anymore
	}
	for {
		n.mu.Lock()
		h, draining := n.handlers[m.Type], n.held.draining[m.Type]
		if h == nil && draining == nil {
			now := time.Now()
			n.held.push(m, now)
			k, total := n.held.toLog(now)
			n.mu.Unlock()
			n.logDropped(k, total)
			return
		}
		n.mu.Unlock()
		if draining == nil {
			n.dispatch(h, m)
			return
		}
		// Behind the kept messages of its type, as a handler's
		// back-pressure would have it: the channel waits.
		select {
		case <-draining:
		case <-n.ctx.Done():
			return
		}
	}
}

// dispatch runs h(m) in a goroutine of its own once a handler slot is
// free, and reports false if the node closed first.
func (n *Node) dispatch(h Handler, m *Message) bool {
	select {
	case n.sem <- struct{}{}:
	case <-n.ctx.Done():
		return false
	}
	n.wg.Add(1)
	go func() {
		defer func() { <-n.sem; n.wg.Done() }()
		h(m)
	}()
	return true
}

// undeliverable fails the cooperation whose message the relay could not
// deliver.
func (n *Node) undeliverable(f *frame) {
	err := &DeliveryError{To: f.name, Code: f.code, Reason: f.reason}
	n.mu.Lock()
	c := n.coops[f.coop]
	n.mu.Unlock()
	if f.coop != 0 && c != nil {
		c.fail(f.name, err)
		return
	}
	n.log.Info("control: message not delivered", "err", err)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// jitter spreads reconnects over d/2..d, so nodes cut off together by a
// relay's restart do not all come back in the same instant.
func jitter(d time.Duration) time.Duration {
	r, _ := rand.Int(rand.Reader, big.NewInt(int64(d/2)+1))
	return d/2 + time.Duration(r.Int64())
}

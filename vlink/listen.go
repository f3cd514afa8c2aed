package vlink

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// Defaults for a zero ListenConfig.
const (
	DefaultSniffTimeout  = 200 * time.Millisecond
	DefaultMaxHandshakes = 256
)

// A ListenConfig configures a VLink listener. Its zero value listens with
// plain TCP and the zero Policy.
type ListenConfig struct {
	// Stack holds the factories to listen with. Zero means tcp. Only its
	// top factory is used to listen; mirrored layers come from each
	// dialer's hello, checked against Policy.
	Stack Stack
	// Shm also takes shared-memory connections (the "shm" layer: Linux,
	// package factories/shm) from this machine's processes of the same
	// user, on the TCP port's number, under the same Policy; dialers on
	// this machine take it by themselves (see ShmMode). Listen only,
	// with the tcp factory.
	Shm bool
	// Quic also takes QUIC connections (the "quic" layer, package
	// factories/quic) on the UDP port of the TCP port's number and host,
	// under the same Policy; dialers choose it with a stack ending in
	// quic. Listen only, with the tcp factory.
	Quic bool
	// QuicCert keeps the QUIC listener's certificate and key (the quic
	// layer's cert parameter), so its pin survives restarts. Empty means
	// a new key each time.
	QuicCert string
	// Policy decides what dialers may ask for.
	Policy Policy
	// HandshakeTimeout bounds each connection's handshake, from accept to
	// ready, unless its dialer waits longer for its target (MaxTargetWait).
	// Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxTargetWait is the longest a dialer may have Admit wait for its
	// target (Hello.TargetWait): its handshake's deadline moves that far,
	// past HandshakeTimeout, and Admit's context is canceled as soon as
	// the dialer hangs up (a connection over a socket). It lets a
	// program's own connect timeout govern (vlink exec asks for as long
	// as the kernel's connect waits), where the handshake's would cut
	// a host that drops SYNs. Zero: no dialer moves the deadline.
	MaxTargetWait time.Duration
	// SniffTimeout is how long a connection may stay silent before it is
	// taken as plain. Clients of protocols where the server speaks first
	// (SSH, SMTP) wait this long for the banner. Zero means
	// DefaultSniffTimeout; negative means plain connections are taken at
	// once only when their first bytes arrive, never by silence.
	SniffTimeout time.Duration
	// MaxHandshakes bounds the handshakes in progress at once, and so the
	// memory slow or hostile dialers can hold. Zero means
	// DefaultMaxHandshakes.
	MaxHandshakes int
	// Admit, if set, is called for each VLink connection whose hello
	// passed the policy, before the accept is sent: an error refuses the
	// connection (a *RefusedError is sent as is, any other error as
	// CodeRejected with its text). Its result is kept in Conn.Admitted.
	// vlink serve uses it to reach the forwarding target first, so an
	// unreachable target is reported to the dialer.
	Admit func(ctx context.Context, h *Hello) (any, error)
	// Lookup answers the hellos that ask whether a target's host
	// resolves (Hello.Lookup, sent by Dialer.LookupHost), once the
	// policy has allowed the target: the host's address families, or an
	// error. An error that is a *net.DNSError with IsNotFound is sent as
	// CodeNoSuchHost, which the dialer reports as the resolver would. Nil
	// refuses lookups (CodeRejected); LookupFamilies is the usual answer
	// of a listener that dials the targets it forwards to.
	Lookup func(ctx context.Context, h *Hello) (Families, error)
	// Logger receives one record per refused or failed handshake, at
	// level Info, and per accepted connection at Debug. Nil: no logs.
	Logger *slog.Logger
	// Observe, if set, is told how each handshake ended, as it ends: c is
	// the accepted connection (nil on failure, and for a connection a
	// multi-link layer took over as a member of its session), took how
	// long the handshake ran (Admit included), err why it failed: a
	// *RefusedError when refused, ErrPlainRefused, ErrShed, or the
	// failure (a deadline, a malformed hello), wrapped in a
	// *HandshakeError naming the hello's stack once one was read. It
	// runs on the handshake's goroutine, so it must not block: it is
	// meant for metrics.
	Observe func(c *Conn, took time.Duration, err error)
	// Handle, if set, takes each connection whose handshake succeeded on
	// the goroutine that ran the handshake, instead of handing it to
	// Accept through another goroutine: a connection then reaches its
	// handler with one hand-off between goroutines fewer, which is most
	// of what a short connection costs on a loaded machine (vlink serve
	// uses it; docs/BENCHMARKS.md §3). Handle owns the connection and
	// may run as long as it needs: the Listener has let go of it, and
	// Close does not wait for Handle to return. Accept then returns only
	// the Listener's end.
	Handle func(c *Conn)
}

// Hello is what a VLink dialer asked for, as accepted by the listener.
type Hello struct {
	// Stack holds the mirrored layers, from the application side down.
	Stack Stack
	// Target is where the dialer asked to be forwarded; empty for the
	// listener itself.
	Target string
	// Authenticated reports that the dialer proved it holds the key.
	Authenticated bool
	// Node is the node name the dialer proved; empty when it named none.
	// A dialer that names a node proves that node's key, NodeKey of
	// Policy.Key and the name, so it can prove no other node's name.
	// The connections a multi-link layer builds inherit it.
	Node string
	// RemoteAddr is where the connection came from: for one that came
	// through route layers (fwd), its origin as the first node saw it,
	// which each node vouched for with its key, or, when a node on the
	// way had none, the last node's address.
	RemoteAddr net.Addr
	// Hops are the nodes this listener is asked to carry the connection
	// through, in order (see layer.Route): the first is the next node.
	// A listener that takes such a hello forwards it with DialNextHop;
	// nothing is mirrored on the way.
	Hops []string
	// Forwarded is how many nodes the connection crossed to get here.
	Forwarded int
	// Lookup marks a hello that only asks whether Target's host resolves
	// (Dialer.LookupHost): the listener answers with ListenConfig.Lookup
	// and connects nothing.
	Lookup bool
	// Datagram marks a hello that opens a datagram session to Target
	// (Dialer.Dial with network "udp"): the connection then carries
	// datagrams, each framed whole (netconn/dgram.NewConn reads and
	// writes them), and Policy.Datagrams, not Targets, decides which
	// targets it may name.
	Datagram bool
	// QUICDatagrams marks a datagram session whose datagrams, those that
	// fit a packet, ride QUIC DATAGRAM frames (RFC 9221) beside the
	// connection's QUIC stream, unreliably, and the rest the stream:
	// read and write them with DatagramConn, which NewConn would not.
	// The dialer asks for it when its stack's bottom is a quic stream
	// straight to this listener whose path carries datagrams, and the
	// listener accepts it only then (the datagram field's value 2).
	QUICDatagrams bool
	// Cert is the certificate the dialer presented, checked against
	// Policy.Member's trust; nil when it presented none. Node is then
	// its name. The encryption layer of the hello's segment proves the
	// dialer holds its key before the connection is handed out; Admit,
	// which runs before, sees the name as claimed.
	Cert *nodecert.Certificate
	// CongestionControl is the congestion control algorithm the dialer
	// asked for (tcp's cc parameter): its TCP connection's sender uses
	// it, and the listener set it on its own side of that connection
	// before it accepted, so that what goes back uses it too. Empty: the
	// system's default.
	CongestionControl string
	// Session is, for a connection a multi-link layer built (a mux
	// stream, a parallel session), the mirrored layers of its members'
	// hello: the multi-link layer and those below it, so that Stack and
	// Session together are what the dialer stacked. Empty otherwise.
	Session Stack
	// TargetWait is how long the dialer waits for the listener to reach
	// Target, when it said (only a wait beyond DefaultHandshakeTimeout is
	// said): a program's own connect timeout, under vlink exec. Zero: it
	// said nothing. ListenConfig.MaxTargetWait bounds what it gets.
	TargetWait time.Duration
	// AEAD is the cipher the hello agreed on for the stack's encryption
	// layer (layer.AEADNegotiator): the first this listener runs well
	// among those the dialer offered. AEADDefault when the hello offered
	// none (an older wire version of the layer, or no such layer).
	AEAD layer.AEAD

	carrier     layer.DatagramCarrier // QUICDatagrams': the stream's
	key         []byte                // the key proven: Policy.Key, or Node's key derived from it
	listener    *Listener
	route       bool   // the hello goes on to Hops, or ends a route here
	trail       []byte // the forwarding listeners crossed (trailIDSize each)
	serverProof []byte
	helloBody   []byte // with nonce, for a lookup's proof (lookupProof)
	nonce       []byte
	binding     []byte // the channel's, when the proofs cover it (channelBinding)
	transcript  []byte // the handshake's bytes, for layer.HandshakeFilter
	static      bool   // the accept announces the listener's identity
	// first: the encryption layer's first message, which came with the
	// hello and was taken with it (firstflight.go); nil once handed to
	// the layer, and for a hello answered the long way
	first []byte
	// early: the layer takes the data in first (takesEarly);
	// offersEarly: its answer says this listener takes early data.
	// Both for the bottom layer only, as first.
	early, offersEarly bool
	nested             bool // a nested hello: its connection's hello carried the certificates
	// clear: the hello needs encryption and has none, which the nested
	// hellos above its multi-link layer must then bring. unproven: no
	// encryption layer below has proven the listener's identity yet.
	clear, unproven bool
}

// Conn is a connection accepted by a Listener.
type Conn struct {
	net.Conn
	hello    *Hello
	admitted any
}

var (
	_ net.Conn      = (*Conn)(nil)
	_ io.ReaderFrom = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)

	_ netconn.Unwrapper = (*Conn)(nil)
)

// DatagramConn returns the datagram session of c, whose hello is a
// Datagram one: over QUIC datagrams and c when the hello asked for
// them (Hello.QUICDatagrams, see dgram.NewConnOver), else over c alone
// (dgram.NewConn). remote is what its RemoteAddr reports; nil reports
// c's.
func DatagramConn(c *Conn, remote net.Addr) *dgram.Conn {
	if h := c.hello; h != nil && h.QUICDatagrams && h.carrier != nil {
		return dgram.NewConnOver(c, h.carrier, nil, remote)
	}
	return dgram.NewConn(c, nil, remote)
}

// Hello returns what the dialer asked for, or nil for a plain connection.
func (c *Conn) Hello() *Hello { return c.hello }

// Admitted returns what ListenConfig.Admit returned for this connection.
func (c *Conn) Admitted() any { return c.admitted }

// UnwrapConn tells netconn.Relay that Conn adds nothing to the bytes of
// the connection below.
func (c *Conn) UnwrapConn() net.Conn { return c.Conn }

// CloseWrite shuts down the writing side, if the layers below can.
func (c *Conn) CloseWrite() error { return netconn.CloseWrite(c.Conn) }

// ReadFrom lets io.Copy use the layer below's fast path (for TCP, the
// kernel's zero-copy path, splice(2)).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

// WriteTo lets io.Copy use the layer below's fast path.
func (c *Conn) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, c.Conn) }

// A Listener accepts VLink and plain connections on one port. Handshakes
// run in their own goroutines, bounded by MaxHandshakes, so a slow or
// hostile dialer never holds up Accept; a failed handshake only costs its
// own connection.
type Listener struct {
	inner   net.Listener
	cfg     ListenConfig
	targets *selector.Selector
	// datagrams: Policy.Datagrams; nil forwards none
	datagrams *selector.Selector
	hops      *selector.Selector // Policy.Hops; nil: forwards to no node
	id        [trailIDSize]byte  // this listener in the trail of a route, for loops
	static    []byte             // the public half of Policy.Identity, nil for none
	log       *slog.Logger

	ready  chan *Conn
	shed   *shedder      // bounds the accepted connections in handshake
	replay *replayRecord // the first flights taken, see replay.go
	sem    chan struct{} // bounds the nested handshakes (Junction.Deliver)
	done   chan struct{}
	ctx    context.Context // cancelled by Close, for Admit
	cancel context.CancelFunc

	mu         sync.Mutex
	err        error                 // why the accept loop stopped
	pending    map[net.Conn]struct{} // connections in handshake, closed by Close
	layerState map[string]any        // multi-link layers' state, see layer.Junction.State

	closeOnce sync.Once
	wg        sync.WaitGroup
}

var _ net.Listener = (*Listener)(nil)

// Listen listens on address with the zero ListenConfig.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen announces on the local network address with the config's top
// factory and returns a VLink listener on it.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (*Listener, error) {
	if err := lc.Policy.Validate(); err != nil {
		return nil, err
	}
	stack := lc.Stack
	if len(stack.Layers) == 0 {
		var err error
		if stack, err = Parse(""); err != nil {
			return nil, err
		}
	}
	if !stack.IsPlain() {
		return nil, fmt.Errorf("vlink: listen: stack %s has mirrored layers; a listener takes those from each dialer's hello", stack)
	}
	var inner net.Listener
	for attempt := 1; ; attempt++ {
		tl, err := ListenStack(ctx, stack, network, address)
		if err != nil {
			return nil, err
		}
		lc.logPin(tl)
		if !lc.Quic {
			inner = tl
			break
		}
		inner, err = lc.listenQuic(ctx, stack, tl)
		if err == nil {
			break
		}
		// The port the kernel picked for TCP may be taken on UDP: pick
		// again, until a number is free for both.
		if !anyPort(address) || !errors.Is(err, syscall.EADDRINUSE) || attempt == maxPortPicks {
			return nil, err
		}
	}
	if lc.Shm {
		var err error
		if inner, err = listenShm(ctx, stack, inner); err != nil {
			return nil, err
		}
	}
	l, err := lc.NewListener(inner)
	if err != nil {
		inner.Close()
		return nil, err
	}
	return l, nil
}

// maxPortPicks bounds how many ports Listen tries for a listener on port
// 0 that needs its number free on several transports.
const maxPortPicks = 64

// anyPort reports whether address asks for any port (port 0).
func anyPort(address string) bool {
	_, port, err := net.SplitHostPort(address)
	return err == nil && (port == "0" || port == "")
}

// ListenStack listens on address with the top factory of a plain stack,
// which reaches its next hop through the factories below it, and returns
// that factory's own listener: no hello, no sniffing. With
// "ssh:host=bastion" it listens on the SSH server's side, as ssh -R does;
// vlink tunnel uses it for plain clients. A zero stack listens with tcp.
func ListenStack(ctx context.Context, stack Stack, network, address string) (net.Listener, error) {
	if len(stack.Layers) == 0 {
		var err error
		if stack, err = Parse(""); err != nil {
			return nil, err
		}
	}
	if !stack.IsPlain() {
		return nil, fmt.Errorf("vlink: listen: stack %s has mirrored layers; only factories can listen", stack)
	}
	spec, v, err := stack.Layers[0].build()
	if err != nil {
		return nil, err
	}
	lf, ok := v.(layer.ListenFactory)
	if !ok {
		return nil, fmt.Errorf("vlink: listen: factory %s cannot listen", spec.Name)
	}
	// The factories below the listening one carry its connection to its
	// next hop, as they do for a dial.
	var forward layer.ContextDialer
	if len(stack.Layers) > 1 {
		if forward, err = buildTransport(stack.Layers[1:]); err != nil {
			return nil, err
		}
	}
	return lf.Listen(ctx, network, address, forward)
}

// NewListener serves VLink on an existing listener, which the returned
// Listener owns.
func (lc *ListenConfig) NewListener(inner net.Listener) (*Listener, error) {
	if err := lc.Policy.Validate(); err != nil {
		return nil, err
	}
	l := &Listener{
		inner:   inner,
		cfg:     *lc,
		log:     lc.Logger,
		ready:   make(chan *Conn),
		done:    make(chan struct{}),
		pending: map[net.Conn]struct{}{},
	}
	l.targets, _ = lc.Policy.targets() // checked by Validate
	l.datagrams, _ = lc.Policy.datagrams()
	l.hops, _ = lc.Policy.hops()
	if lc.Policy.Identity != nil {
		l.static, _ = IdentityPublic(lc.Policy.Identity) // checked by Validate
	}
	rand.Read(l.id[:])
	l.replay = newReplayRecord(time.Now())
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.cfg.HandshakeTimeout <= 0 {
		l.cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.cfg.SniffTimeout == 0 {
		l.cfg.SniffTimeout = DefaultSniffTimeout
	}
	if l.cfg.MaxHandshakes <= 0 {
		l.cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	plainAt := time.Duration(0) // when a parked silent connection may be taken as plain
	if l.cfg.SniffTimeout > 0 && l.cfg.Policy.plainAllowed() {
		plainAt = l.cfg.SniffTimeout
	}
	var markedHello func(net.Conn, []byte) bool
	if l.cfg.Policy.Key != nil {
		markedHello = l.markedFirstFlight
	}
	l.shed = newShedder(l.cfg.MaxHandshakes, l.cfg.HandshakeTimeout, plainAt, markedHello, l.startHandshake)
	l.sem = make(chan struct{}, l.cfg.MaxHandshakes)
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Accept waits for the next connection whose handshake succeeded.
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptVLink() }

// AcceptVLink is Accept returning the concrete type.
func (l *Listener) AcceptVLink() (*Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return nil, &net.OpError{Op: "accept", Net: "vlink", Addr: l.inner.Addr(), Err: err}
	}
}

// Addr returns the listener's network address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Close stops listening, closes connections still in their handshake or
// not yet accepted, and waits for the listener's goroutines to end.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.closeOnce.Do(func() {
		l.shed.close() // first: no parked connection is started after done
		close(l.done)
		l.cancel()
		err = l.inner.Close()
		l.mu.Lock()
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return err
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	backoff := netconn.AcceptBackoff{Log: l.log}
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if backoff.Wait(err, l.done) {
				continue // out of descriptors and the like
			}
			select {
			case <-l.done:
				return
			default:
			}
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
			l.closeOnce.Do(func() { l.shed.close(); close(l.done); l.cancel(); l.inner.Close() })
			return
		}
		backoff.Reset()
		// Never wait for a slot: that would let dialers that stay silent
		// keep everyone out. The shedder makes room, or parks c.
		l.Take(c)
	}
}

// Take runs the handshake of c, a connection accepted by other means than
// the listener's own Accept (an event loop that read none of its bytes
// and handed it on), as the listener runs those it accepts: bounded by
// MaxHandshakes, then delivered to Accept or Handle. It returns at once;
// once the listener is closed, it closes c.
func (l *Listener) Take(c net.Conn) {
	if now := time.Now(); l.shed.admit(c, now) {
		l.startHandshake(c, now)
	}
}

// startHandshake runs the handshake of c, accepted at the given time and
// given a slot, in a goroutine of its own; once the listener is closed it
// frees the slot and closes c instead.
func (l *Listener) startHandshake(c net.Conn, accepted time.Time) {
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		l.shed.done(c)
		c.Close()
		return
	default:
	}
	// Counted before Close can see the listener empty: Close takes mu
	// after it closes done.
	l.wg.Add(1)
	l.pending[c] = struct{}{}
	l.mu.Unlock()
	go l.serve(c, accepted)
}

// track registers a connection in handshake so Close can interrupt it.
func (l *Listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		return false
	default:
	}
	l.pending[c] = struct{}{}
	return true
}

func (l *Listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
}

// serve runs one connection's handshake and hands the result to Accept,
// or to Handle once the listener let go of it.
func (l *Listener) serve(raw net.Conn, accepted time.Time) {
	if c := l.serveHandshake(raw, accepted); c != nil {
		l.cfg.Handle(c)
	}
}

// serveHandshake is serve up to the hand-over: it returns the connection
// for Handle, if it is set and the handshake succeeded.
func (l *Listener) serveHandshake(raw net.Conn, accepted time.Time) *Conn {
	defer l.wg.Done()
	c, err := l.handshake(raw, accepted)
	l.untrack(raw)
	shed := l.shed.done(raw)
	if errors.Is(err, ErrPlainRefused) {
		// Refused unheard, as TCP refuses a connection nobody takes: a
		// reset on every transport (TCP's kernel sends one anyway for
		// the bytes left unread), never a clean end of an empty stream.
		netconn.Abort(raw)
	}
	if err != nil {
		raw.Close()
		if shed {
			err = ErrShed
			l.log.Debug("vlink: shed to make room for another handshake", "remote", raw.RemoteAddr().String())
		} else {
			l.logFailure(raw.RemoteAddr(), err)
		}
	}
	l.observe(c, accepted, err)
	if err != nil {
		return nil
	}
	return l.deliver(c)
}

// observe tells ListenConfig.Observe how a handshake begun at start
// ended.
func (l *Listener) observe(c *Conn, start time.Time, err error) {
	if l.cfg.Observe != nil {
		l.cfg.Observe(c, time.Since(start), err)
	}
}

// deliver hands a connection to Accept, or returns it for Handle; it
// closes it if the listener closed first. A nil c was taken over by a
// multi-link layer. It runs before the handshake's goroutine lets go of
// the listener's wait group, so Close finds every connection either
// handed over or closed.
func (l *Listener) deliver(c *Conn) *Conn {
	if c == nil {
		return nil
	}
	if l.cfg.Handle != nil {
		select {
		case <-l.done:
		default:
			return c
		}
	} else {
		select {
		case l.ready <- c:
			return nil
		case <-l.done:
		}
	}
	c.Close()
	if a, ok := c.admitted.(io.Closer); ok {
		a.Close()
	}
	return nil
}

// serveNested runs the nested hello on a connection a multi-link layer
// built, as serve does for an accepted one. The connection must open
// with a hello: a dialer always sends one there.
func (l *Listener) serveNested(c net.Conn, j *junction) {
	if conn := l.serveNestedHandshake(c, j); conn != nil {
		l.cfg.Handle(conn)
	}
}

// serveNestedHandshake is serveNested up to the hand-over, as
// serveHandshake is serve's.
func (l *Listener) serveNestedHandshake(c net.Conn, j *junction) *Conn {
	defer l.wg.Done()
	start := time.Now()
	var conn *Conn
	err := func() error {
		defer func() { <-l.sem }() // taken by Deliver
		deadline := time.Now().Add(l.cfg.HandshakeTimeout)
		if err := c.SetDeadline(deadline); err != nil {
			return err
		}
		var m [len(magic)]byte
		if _, err := io.ReadFull(c, m[:]); err != nil {
			return fmt.Errorf("reading nested hello: %w", err)
		}
		if string(m[:]) != magic {
			return sendRefusal(c, refuse(CodeMalformed, "a connection built by a multi-link layer must open with a hello"))
		}
		h, err := l.serverHandshake(c, j, nil)
		if err != nil {
			return err
		}
		conn, err = l.finish(c, h, deadline, j.depth)
		return withStack(err, h.Stack.String())
	}()
	l.untrack(c)
	if err != nil {
		c.Close()
		l.logFailure(j.remote, err)
	}
	l.observe(conn, start, err)
	if err != nil {
		return nil
	}
	return l.deliver(conn)
}

func (l *Listener) logFailure(remote net.Addr, err error) {
	var re *RefusedError
	if errors.As(err, &re) {
		l.log.Info("vlink: refused", "remote", remote.String(), "code", re.Code.String(), "reason", re.Reason)
	} else {
		l.log.Info("vlink: handshake failed", "remote", remote.String(), "err", err)
	}
}

func (l *Listener) handshake(raw net.Conn, accepted time.Time) (*Conn, error) {
	deadline := accepted.Add(l.cfg.HandshakeTimeout)
	isVLink, prefix, err := l.sniff(raw, deadline)
	if err != nil {
		return nil, err
	}
	if !isVLink {
		if _, ok := raw.(Vouched); ok {
			return nil, errors.New("a connection from another node of the network sent no hello")
		}
		if !l.cfg.Policy.plainAllowed() {
			return nil, ErrPlainRefused
		}
		if err := raw.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
		l.log.Debug("vlink: accepted plain", "remote", raw.RemoteAddr().String())
		return &Conn{Conn: netconn.Prefixed(raw, prefix)}, nil
	}
	h, err := l.serverHandshake(raw, nil, nil)
	if err != nil {
		return nil, err
	}
	// Past the policy, and with a key, proven: no longer sheddable. A
	// certificate is proven by the encryption layer, below: until then
	// it is only claimed, and anyone can copy one.
	if h.Cert == nil {
		l.shed.authenticated(raw)
	}
	if h.ends() {
		// The last node of a route forwarded the connection here:
		// the dialer's own hello follows, end to end.
		if err := accept(raw, h); err != nil {
			return nil, fmt.Errorf("sending accept: %w", err)
		}
		var m [len(magic)]byte
		if _, err := io.ReadFull(raw, m[:]); err != nil {
			return nil, fmt.Errorf("reading the end-to-end hello: %w", err)
		}
		if string(m[:]) != magic {
			return nil, errors.New("a forwarded connection did not open with its dialer's hello")
		}
		if h, err = l.serverHandshake(raw, nil, h); err != nil {
			return nil, err
		}
	}
	c, err := l.finish(raw, h, deadline, 0)
	if err == nil && h.Cert != nil {
		l.shed.authenticated(raw) // the encryption layer proved it
	}
	return c, withStack(err, h.Stack.String())
}

// finish completes a handshake whose hello passed the policy: it admits
// the connection, accepts it and builds the mirrored layers on it. When
// the hello's top layer is a multi-link layer, that layer takes the
// connection over and finish returns a nil *Conn: what the layer builds
// comes back through its Junction.
func (l *Listener) finish(raw net.Conn, h *Hello, deadline time.Time, depth int) (*Conn, error) {
	start := time.Now()
	mirrored := h.Stack.Layers
	var ml layer.MultiLink
	var j *junction      // where what ml builds comes back
	release := func() {} // gives back the room a layer.Reserver holds
	if len(mirrored) > 0 {
		_, v, err := mirrored[0].build()
		if err != nil {
			return nil, err
		}
		if ml, _ = v.(layer.MultiLink); ml != nil {
			// The layers above come with the nested hello, and the
			// target too; the multi-link layer is admitted there.
			if depth >= maxNesting {
				return nil, sendRefusal(raw, refuse(CodeLayer, "multi-link layers nested more than %d deep", maxNesting))
			}
			if h.Target != "" {
				return nil, sendRefusal(raw, refuse(CodeMalformed, "a hello for a multi-link layer names no target; the nested hello does"))
			}
			j = &junction{l: l, authenticated: h.Authenticated, node: h.Node, key: h.key, cert: h.Cert, depth: depth + 1, remote: h.RemoteAddr, forwarded: h.Forwarded,
				clear: h.clear, unproven: h.unproven, session: Stack{Layers: append(slices.Clip(h.Stack.Layers), h.Session.Layers...)}}
			// Before the accept: once it is sent, the dialer can no
			// longer be told that the layer has no room.
			if r, ok := ml.(layer.Reserver); ok {
				if release, err = r.Reserve(j); err != nil {
					return nil, sendRefusal(raw, refuse(CodeBusy, "layer %s: %v", mirrored[0].Name, err))
				}
			}
		}
	}
	if h.Lookup {
		if ml != nil {
			release()
			return nil, sendRefusal(raw, refuse(CodeMalformed, "a lookup's hello is the top one; it names no multi-link layer"))
		}
		return nil, l.answerLookup(raw, h, deadline)
	}
	var admitted any
	if l.cfg.Admit != nil && ml == nil {
		ctx, cancel := context.WithDeadline(l.ctx, deadline)
		stop := func() {}
		if longer := l.waitLonger(h, deadline); !longer.IsZero() {
			// The dialer waits for its target longer than the
			// handshake would: as long as it waits, or until it
			// hangs up. What follows Admit gets a handshake's time
			// of its own, no more.
			raw.SetDeadline(longer)
			ctx, cancel = context.WithDeadline(l.ctx, longer)
			watching := cancelOnHangUp(raw, cancel, min(hangUpWatchDelay, time.Until(deadline)))
			stop = func() {
				watching()
				raw.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
			}
		}
		var err error
		admitted, err = l.cfg.Admit(ctx, h)
		stop()
		cancel()
		if err != nil {
			var re *RefusedError
			if !errors.As(err, &re) {
				re = refuse(CodeRejected, "%v", err)
			}
			// A target dial that took the handshake's whole time still
			// says why (timed out), rather than ending the connection
			// as a crash would.
			raw.SetWriteDeadline(time.Now().Add(refusalWrite))
			return nil, sendRefusal(raw, re)
		}
	}
	fail := func(err error) (*Conn, error) {
		if c, ok := admitted.(io.Closer); ok {
			c.Close()
		}
		release()
		return nil, err
	}
	if err := accept(raw, h); err != nil {
		return fail(fmt.Errorf("sending accept: %w", err))
	}
	var c net.Conn = raw
	bottom := 0
	if ml != nil {
		bottom = 1
	}
	for i := len(mirrored) - 1; i >= bottom; i-- {
		spec, v, err := mirrored[i].build()
		if err != nil {
			return fail(err)
		}
		f, ok := v.(layer.Filter)
		if !ok {
			return fail(fmt.Errorf("layer %s: a %s below a multi-link layer's hello", spec.Name, spec.Kind))
		}
		if c, err = l.serverFilter(f, c, h); err != nil {
			return fail(fmt.Errorf("layer %s: %w", spec.Name, err))
		}
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	if ml != nil {
		l.log.Debug("vlink: multi-link member", "remote", h.RemoteAddr.String(), "stack", h.Stack.String(), "took", time.Since(start))
		// The layer owns raw (and its reservation) from here on, and
		// watches j.Done() itself: the listener's Close must not close a
		// member of a session it has already accepted.
		l.untrack(raw)
		if err := ml.Accept(c, j); err != nil {
			c.Close()
			return nil, fmt.Errorf("layer %s: %w", mirrored[0].Name, err)
		}
		return nil, nil
	}
	l.log.Debug("vlink: accepted", "remote", h.RemoteAddr.String(), "stack", h.Stack.String(),
		"target", h.Target, "node", h.Node, "hops", h.Hops, "forwarded", h.Forwarded, "took", time.Since(start))
	return &Conn{Conn: c, hello: h, admitted: admitted}, nil
}

// refusalWrite bounds the write of a refusal after Admit, which may
// have used up the handshake's time.
const refusalWrite = time.Second

// waitLonger returns the deadline a hello's TargetWait moves the
// handshake's to, bounded by MaxTargetWait, or the zero time when it
// moves nothing.
func (l *Listener) waitLonger(h *Hello, deadline time.Time) time.Time {
	wait := min(h.TargetWait, l.cfg.MaxTargetWait)
	if wait <= 0 || h.Target == "" {
		return time.Time{}
	}
	if longer := time.Now().Add(wait); longer.After(deadline) {
		return longer
	}
	return time.Time{}
}

// cancelOnHangUp calls cancel if c's dialer hangs up (its end of stream
// or a reset arrives) before stop is called, so that a long wait for a
// target is not spent on a dialer that gave up. The watch starts after
// the delay: a target that answers sooner, as nearly all do, costs no
// goroutine and no wake-up (a connect through vlink exec names its
// program's connect timeout as its wait, so every one of them comes
// here), and a hang-up within it is seen when the watch starts. stop
// ends the watch, which leaves c's read deadline in the past if it had
// started. Only a socket is watched, by peeking: a byte that arrives
// first ends the watch, unread.
func cancelOnHangUp(c net.Conn, cancel func(), delay time.Duration) (stop func()) {
	done := make(chan struct{})
	t := time.AfterFunc(delay, func() {
		defer close(done)
		_, n, ok, err := peekFirst(c)
		if ok && (err == nil && n == 0 || err != nil && !isTimeout(err)) {
			cancel()
		}
	})
	return func() {
		if t.Stop() {
			return // never started
		}
		c.SetReadDeadline(time.Unix(1, 0)) // wakes the peek
		<-done
	}
}

// hangUpWatchDelay bounds the delay before cancelOnHangUp watches: a
// dialer that gave up is seen within it, or within the handshake's
// timeout if that is shorter.
const hangUpWatchDelay = time.Second

// sniff reads exactly as many bytes as it takes to tell the magic from a
// plain client's first bytes, which it returns so they are not lost. On a
// socket it first peeks: a plain client whose first byte is not the
// magic's (no text protocol's is: it is 0x89) keeps every byte in its
// socket, so the connection can be handed on as it is, descriptor and all.
func (l *Listener) sniff(c net.Conn, deadline time.Time) (vlink bool, prefix []byte, err error) {
	sniffBy := deadline
	if l.cfg.SniffTimeout > 0 {
		sniffBy = time.Now().Add(l.cfg.SniffTimeout)
	}
	if err := c.SetReadDeadline(sniffBy); err != nil {
		return false, nil, err
	}
	if first, n, ok, err := peekFirst(c); ok {
		switch {
		case err != nil && isTimeout(err) && l.cfg.SniffTimeout > 0 && time.Now().Before(deadline):
			return false, nil, nil // silent: a server-speaks-first client
		case err != nil:
			return false, nil, fmt.Errorf("sniffing: %w", err)
		case n == 0 || first != magic[0]:
			return false, nil, nil // plain, or a plain client that only half-closed
		}
	}
	// Read as much of the magic as has come, never past it: the hello
	// follows. A dialer sends it in one write, so this is one read.
	var buf [len(magic)]byte
	n := 0
	for n < len(magic) {
		m, err := c.Read(buf[n:])
		for i := n; i < n+m; i++ {
			if buf[i] != magic[i] {
				return false, buf[:n+m], nil // plain: all it sent is relayed
			}
		}
		n += m
		if err != nil {
			if isTimeout(err) && l.cfg.SniffTimeout > 0 && time.Now().Before(deadline) {
				// Silent, maybe after a strict prefix of the magic (a
				// 0x89 of its own protocol): a client waiting for the
				// server to speak, not a dialer, which sends its hello
				// in one write.
				return false, buf[:n], nil
			}
			if errors.Is(err, io.EOF) && n == 0 {
				return false, nil, nil // plain client that only half-closed
			}
			return false, nil, fmt.Errorf("sniffing: %w", err)
		}
		if m > 0 && n < len(magic) && l.cfg.SniffTimeout > 0 {
			// Each part of the magic gives the rest a sniff timeout
			// more, within the handshake's deadline. (Without a sniff
			// timeout, the read deadline is the handshake's already.)
			next := time.Now().Add(l.cfg.SniffTimeout)
			if deadline.Before(next) {
				next = deadline
			}
			if err := c.SetReadDeadline(next); err != nil {
				return false, nil, err
			}
		}
	}
	return true, nil, c.SetDeadline(deadline)
}

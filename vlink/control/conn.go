package control

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// An Addr is a node's port, the address of a connection between nodes.
type Addr struct {
	Node string
	Port uint16
}

func (a Addr) Network() string { return "vlink" }

// String is the address in the form vlink.Dial takes: NODE.vlink.alt:PORT.
func (a Addr) String() string {
	return net.JoinHostPort(a.Node+vlink.NodeSuffix, strconv.Itoa(int(a.Port)))
}

// A Conn is a connection to another node set up through the relay. Its
// two ends hold the same fresh key and each other's names, vouched for
// by the relay (vlink.Vouched): vlink's hello authenticates with that
// key, and the encryption layer runs end to end over it.
type Conn struct {
	net.Conn
	local, remote Addr
	key           []byte
	path          string
	ladder        []vlink.PathStep // the dialer's: what each path did
}

// Ladder returns, on the dialer's end, what the dial saw of each path:
// which it offered (and why not the others), when the node's steps came
// and which won. vlink route prints it.
func (c *Conn) Ladder() []vlink.PathStep { return c.ladder }

var (
	_ net.Conn          = (*Conn)(nil)
	_ netconn.Unwrapper = (*Conn)(nil)
	_ vlink.Vouched     = (*Conn)(nil)

	_ vlink.NodeDialer     = (*Node)(nil)
	_ vlink.PathNodeDialer = (*Node)(nil)
)

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// UnwrapConn returns the TCP connection underneath, so a relay of this
// connection takes the kernel's zero-copy path.
func (c *Conn) UnwrapConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection: the other end reads its end.
func (c *Conn) CloseWrite() error { return netconn.CloseWrite(c.Conn) }

// VouchedPeer returns the node at the other end.
func (c *Conn) VouchedPeer() string { return c.remote.Node }

// VouchedKey returns the key both ends hold for this connection only.
func (c *Conn) VouchedKey() []byte { return c.key }

// Path says how the connection was made: "reverse" (the node dialed
// connected back to the dialer), "splice" (both connected to each other
// at once) or "relay" (the relay carries its bytes).
func (c *Conn) Path() string { return c.path }

// typeReady marks a relay's ready inside the node, as typePeer does a
// lookup's answer.
const typeReady Type = 0xfffe

// Paths says which ways a dial may take to a node; DialPaths takes the
// best one allowed that works.
type Paths uint8

const (
	// PathReverse: the node connects back to this one, which must accept
	// reverse connections (ServeReverse). It crosses a firewall that
	// blocks connections into the node, and nothing carries the bytes
	// but the network.
	PathReverse Paths = 1 << iota
	// PathRelay: the relay carries the bytes, the last resort; it works
	// wherever both nodes reach the relay.
	PathRelay
	// PathSplice: both nodes connect to each other at the same moment
	// (TCP simultaneous open), which crosses stateful firewalls on both
	// sides and NATs that keep ports, with nothing carrying the bytes but
	// the network.
	PathSplice
	// PathsAny: every path, best first (what DialNode takes).
	PathsAny = PathReverse | PathSplice | PathRelay
)

// ErrNoReverse is matched by the error of a dial that allows only the
// reverse path from a node that accepts no reverse connections.
var ErrNoReverse = errors.New("control: reverse connections need this node to accept them (Node.ServeReverse, vlink --reverse-listen)")

// DialNode connects to port on the named node by the best path that
// works (DialPaths with PathsAny), and returns a *Conn. The path that won
// is remembered for 10 minutes: the next dials to the node leave out the
// paths that lost to it (learned.go). It makes Node a vlink.NodeDialer:
// vlink.Dialer's Network dials with it.
func (n *Node) DialNode(ctx context.Context, name string, port uint16) (net.Conn, error) {
	c, err := n.dialLearning(ctx, name, port, PathsAny)
	if err != nil {
		return nil, err // not a nil *Conn in a non-nil net.Conn
	}
	return c, nil
}

// DialNodeWays is DialNode by the paths allow lets through, by name:
// "reverse", "splice", "relay" (what VLINK_PATHS_ONLY and
// VLINK_PATHS_EXCLUDE narrow). It makes Node a vlink.PathNodeDialer.
func (n *Node) DialNodeWays(ctx context.Context, name string, port uint16, allow func(path string) bool) (net.Conn, error) {
	var paths Paths
	for p, path := range map[Paths]string{PathReverse: "reverse", PathSplice: "splice", PathRelay: "relay"} {
		if allow(path) {
			paths |= p
		}
	}
	if paths == 0 {
		return nil, fmt.Errorf("%w: reverse, splice and relay, to %s", vlink.ErrNoWay, name)
	}
	c, err := n.dialLearning(ctx, name, port, paths)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// DialContext connects to a node's address, NODE.vlink.alt:PORT, as
// DialNode does; network must be tcp, tcp4 or tcp6. It makes Node the
// forward dialer of the factories that reach nodes (reverse, relay).
func (n *Node) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("control: dial %s: nodes are reached over tcp", network)
	}
	name, port, ok := vlink.SplitNodeAddr(address)
	if !ok {
		return nil, fmt.Errorf("control: %s is not a node's address (NODE%s:PORT)", address, vlink.NodeSuffix)
	}
	return n.DialNode(ctx, name, port)
}

// DialPaths connects to port on the named node by one of paths, the best
// that works: the node connecting back to this one (PathReverse, when
// this node accepts reverse connections), both connecting at once
// (PathSplice, 100 ms later) and the relay (PathRelay, 500 ms later, or
// once the others failed), raced; this side takes the first connection
// that comes, and the node keeps the same. The node must expose the port
// (Node.Listen). The connection is a *Conn, whose Path says how it came,
// and Ladder what each path did. A refusal is a *DeliveryError matching
// ErrRefused, ErrNoNode, ErrBusy, ErrTimeout or, when no direct path
// worked and the relay was not allowed, ErrUnreachable (its reason says
// what each path met). DialNode and DialNodeWays also remember the path
// that won (learned.go); DialPaths takes exactly paths.
func (n *Node) DialPaths(ctx context.Context, name string, port uint16, paths Paths) (*Conn, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if port == 0 {
		return nil, errors.New("control: port 0")
	}
	if paths&PathsAny == 0 {
		return nil, errors.New("control: no path allowed")
	}
	ctx, cancel := context.WithTimeout(ctx, RendezvousTimeout+vlink.DefaultHandshakeTimeout)
	defer cancel()
	dial := &frame{op: opDial, name: name, port: port, key: make([]byte, keySize)}
	rand.Read(dial.token[:])
	rand.Read(dial.key)
	if paths&PathRelay == 0 {
		dial.flags |= flagNoRelay
	}
	// The splice's port, opened before the dial names it.
	var (
		spliced   *net.TCPListener
		spliceErr error
	)
	if paths&PathSplice != 0 {
		if spliceErr = n.spliceCheck(); spliceErr == nil {
			spliced, spliceErr = n.spliceListen(ctx)
		}
		if spliceErr == nil {
			defer spliced.Close()
			dial.flags |= flagSplice
			dial.splice = netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(spliced.Addr().(*net.TCPAddr).Port))
		}
	}
	start := time.Now()
	// What the dial sees of each path, in the node's order, for Ladder.
	ladder := []vlink.PathStep{{Path: "reverse"}, {Path: "splice"}, {Path: "relay", Offered: paths&PathRelay != 0}}
	switch {
	case paths&PathSplice == 0:
		ladder[1].Note = "not allowed"
	case spliceErr != nil:
		ladder[1].Note = spliceErr.Error()
	default:
		ladder[1].Offered = true
	}
	if paths&PathRelay == 0 {
		ladder[2].Note = "not allowed"
	}
	// Where the node would connect back to us, if we accept that.
	w := &reverseWait{conn: make(chan pathConn), punch: make(chan netip.AddrPort, 1), done: make(chan struct{})}
	defer close(w.done)
	n.mu.Lock()
	if paths&PathReverse != 0 {
		for _, p := range n.reversePorts {
			dial.addrs = append(dial.addrs, netip.AddrPortFrom(netip.IPv4Unspecified(), p))
		}
	}
	switch {
	case paths&PathReverse == 0:
		ladder[0].Note = "not allowed"
	case len(dial.addrs) == 0:
		ladder[0].Note = "this node takes no connections back (Node.ServeReverse, --reverse-listen)"
	default:
		ladder[0].Offered = true
	}
	direct := len(dial.addrs) > 0 || dial.flags&flagSplice != 0
	if direct {
		n.reverse[dial.token] = w
	}
	n.mu.Unlock()
	if !direct && paths&PathRelay == 0 {
		if paths&PathReverse == 0 {
			return nil, fmt.Errorf("control: splicing to %s: %w", name, spliceErr)
		}
		if spliceErr != nil && paths&PathSplice != 0 {
			return nil, fmt.Errorf("%w; and splicing: %w", ErrNoReverse, spliceErr)
		}
		return nil, ErrNoReverse
	}
	defer func() {
		n.mu.Lock()
		delete(n.reverse, dial.token)
		n.mu.Unlock()
	}()
	coop := n.Cooperate(Expect{Type: typeReady})
	defer coop.Cancel()
	dial.coop = coop.token
	sent := time.Now()
	ch, err := n.sendOn(ctx, dial)
	if err != nil {
		return nil, err
	}
	coop.sentOn(ch)
	remote := Addr{name, port}
	// The splice, if the node answers with a punch, runs until this dial
	// returns.
	splicing, stopSplice := context.WithCancel(ctx)
	var spliceDone sync.WaitGroup
	defer spliceDone.Wait()
	defer stopSplice()
	for waiting := true; waiting; {
		select {
		case c := <-w.conn:
			// Taken: the node hears so (attached), and the relay that it
			// carries nothing.
			c.SetDeadline(time.Now().Add(reverseTimeout))
			if _, err := c.Write((&frame{op: opAttached}).append(nil)); err != nil {
				c.Close()
				continue
			}
			c.SetDeadline(time.Time{})
			ch.trySend(&frame{op: opDecline, token: dial.token, code: codeDirect})
			won := &ladder[0]
			if c.path == "splice" {
				won = &ladder[1]
			}
			won.Won, won.At = true, time.Since(start)
			return &Conn{Conn: c.Conn, local: Addr{n.cfg.Name, 0}, remote: remote, key: dial.key, path: c.path, ladder: ladder}, nil
		case peer := <-w.punch:
			// The node waits for the sync; it arrives about half this
			// round trip from now, when this side connects too.
			rtt := time.Since(sent)
			ladder[1].At, ladder[1].Note = time.Since(start), "the node was ready to splice"
			ch.trySend(&frame{op: opSync, token: dial.token})
			spliceDone.Add(1)
			go func() {
				defer spliceDone.Done()
				n.spliceFrom(splicing, spliced, peer, rtt/2)
			}()
		case <-coop.Done():
			waiting = false
		case <-ctx.Done():
			waiting = false
		}
	}
	// The relay it is, or nothing: no connection from the node is taken
	// from here on.
	n.mu.Lock()
	delete(n.reverse, dial.token)
	n.mu.Unlock()
	replies, err := coop.Wait(ctx)
	if err != nil {
		return nil, err
	}
	ladder[2].At = time.Since(start)
	c, err := n.attach(ctx, replies[0].ready.token)
	if err != nil {
		return nil, fmt.Errorf("control: connecting to %s through the relay: %w", name, err)
	}
	ladder[2].Won = true
	return &Conn{Conn: c, local: Addr{n.cfg.Name, 0}, remote: remote, key: dial.key, path: "relay", ladder: ladder}, nil
}

// punched hands a node's punch to the dial whose token it carries.
func (n *Node) punched(f *frame) {
	n.mu.Lock()
	w := n.reverse[f.token]
	n.mu.Unlock()
	if w != nil {
		select {
		case w.punch <- f.splice:
		default: // one punch per dial
		}
	}
}

// attach opens a data connection to the relay the node is registered
// with, for the rendezvous of token, and waits until both ends are there.
func (n *Node) attach(ctx context.Context, token [tokenSize]byte) (net.Conn, error) {
	n.mu.Lock()
	relay := n.relay
	n.mu.Unlock()
	// A hello proves the node; no encryption layer of its own: the
	// nodes encrypt end to end inside it.
	d := vlink.Dialer{Stack: vlink.MustParse("identity"), Key: n.cfg.Key, Node: n.cfg.Name, InsecurePlaintext: true}
	if n.cfg.Member != nil {
		// A member's end proves nothing but the token: it holds no key
		// the relay could check, and needs none (RelayConfig.Member).
		d = vlink.Dialer{Stack: vlink.MustParse("identity"), InsecurePlaintext: true}
	}
	c, err := d.DialContext(ctx, "tcp", relay)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := netconn.InterruptOnDone(ctx, c)
	_, err = c.Write((&frame{op: opAttach, token: token}).append(nil))
	var f *frame
	if err == nil {
		f, err = readFrame(c)
	}
	if err == nil && f.op != opAttached {
		err = fmt.Errorf("%w: the relay answered attach with %s", ErrMalformed, f.op)
	}
	if !stop() && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		if errors.Is(err, io.EOF) {
			err = errors.New("the relay closed the connection: the other end never came, or the token expired")
		}
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// Listen exposes the node: connections other nodes open to it through
// the relay arrive on the returned listener. allow decides, for each,
// from the dialing node's name and the port it asked for; its error is
// the refusal's reason the dialer reads. A nil allow exposes nothing.
// A node has one listener at a time.
func (n *Node) Listen(allow func(from string, port uint16) error) (net.Listener, error) {
	if allow == nil {
		allow = func(string, uint16) error { return errors.New("this node exposes no port") }
	}
	l := &listener{n: n, allow: allow, conns: make(chan net.Conn, acceptBacklog), done: make(chan struct{}), from: map[string]int{}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listener != nil {
		return nil, errors.New("control: the node has a listener already")
	}
	if n.ctx.Err() != nil {
		return nil, net.ErrClosed
	}
	n.listener = l
	return l, nil
}

// Limits of a node's listener.
const (
	// acceptBacklog bounds the connections set up and not yet accepted.
	acceptBacklog = 128
	// maxOffers bounds the offers being taken at once, and
	// maxOffersPerNode those from one dialing node, so that one node
	// cannot keep the others out; more are declined as busy.
	maxOffers        = 64
	maxOffersPerNode = maxOffers / 4
)

// listener is a node's listener for connections through the relay.
type listener struct {
	n      *Node
	allow  func(string, uint16) error
	conns  chan net.Conn
	done   chan struct{}
	once   sync.Once
	offers int            // being taken; under n.mu
	from   map[string]int // offers being taken, by dialing node; under n.mu
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "vlink", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.n.mu.Lock()
		if l.n.listener == l {
			l.n.listener = nil
		}
		l.n.mu.Unlock()
		for {
			select {
			case c := <-l.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

func (l *listener) Addr() net.Addr { return Addr{l.n.cfg.Name, 0} }

// offer takes or declines a relay's offer of a connection.
func (n *Node) offer(ch *channel, f *frame) {
	decline := func(code Code, reason string) {
		ch.trySend(&frame{op: opDecline, token: f.token, code: code, reason: reason})
	}
	n.mu.Lock()
	l := n.listener
	busy, yours := false, false
	if l != nil {
		busy, yours = l.offers >= maxOffers, l.from[f.name] >= maxOffersPerNode
		if !busy && !yours {
			l.offers++
			l.from[f.name]++
		}
	}
	n.mu.Unlock()
	switch {
	case l == nil:
		decline(CodeRefused, "this node accepts no connections")
		return
	case busy:
		decline(CodeBusy, "this node is setting up as many connections as it takes")
		return
	case yours:
		decline(CodeBusy, fmt.Sprintf("this node is setting up %d connections from %s already", maxOffersPerNode, f.name))
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() {
			n.mu.Lock()
			l.offers--
			if l.from[f.name]--; l.from[f.name] == 0 {
				delete(l.from, f.name)
			}
			n.mu.Unlock()
		}()
		if err := l.allow(f.name, f.port); err != nil {
			decline(CodeRefused, err.Error())
			return
		}
		ctx, cancel := context.WithTimeout(n.ctx, RendezvousTimeout)
		defer cancel()
		c, path, errs := n.paths(ctx, ch, f)
		switch {
		case c != nil && path != "relay":
			ch.trySend(&frame{op: opDecline, token: f.token, code: codeDirect})
		case c != nil:
		case f.flags&flagNoRelay != 0:
			reason := "the dialer accepts no connections back"
			if len(errs) > 0 {
				reason = strings.Join(errs, "; ") + "; and the dial forbids the relay"
			}
			decline(CodeUnreachable, truncate(reason, maxReason))
			return
		default:
			n.log.Info("control: could not take a connection", "from", f.name, "port", f.port, "err", strings.Join(errs, "; "))
			return
		}
		conn := &Conn{Conn: c, local: Addr{n.cfg.Name, f.port}, remote: Addr{f.name, 0}, key: f.key, path: path}
		n.log.Debug("control: connection from a node", "from", f.name, "port", f.port, "path", path)
		select {
		case l.conns <- conn:
		case <-l.done:
			c.Close()
		default:
			netconn.Abort(c) // the backlog is full: the dialer sees a reset
		}
	}()
}

// reverseTimeout bounds one attempt to connect back to a dialer, so an
// unreachable dialer costs the relayed path little.
const reverseTimeout = 2 * time.Second

// pathConn is a connection made by a path.
type pathConn struct {
	net.Conn
	path string
}

// Staggers of the paths the node dialed tries, as Happy Eyeballs
// staggers its attempts: where several work, the connection comes the
// same way every time, and the better way.
const (
	// spliceStagger is how long the reverse path, the simpler one, runs
	// alone before splicing starts too; where reverse is blocked, splicing
	// pays only this.
	spliceStagger = 100 * time.Millisecond
	// relayStagger is how long the direct paths run before the relay
	// joins the race, unless they all failed sooner; where neither direct
	// path works, the relay pays this.
	relayStagger = 500 * time.Millisecond
)

// paths races the paths offer f allows, and returns the connection the
// dialer took, its path; or nil and why each path failed. The paths:
// connecting back to the dialer at once; splicing, whose connecting
// starts spliceStagger later or once reverse failed (its exchange with
// the dialer starts at once, so the dialer times its side well); the
// relay, relayStagger later or once both failed. The dialer decides: it
// answers attached on the one connection it takes, and tells the relay
// when that is not the relay's; so the first path to come back attached
// is the connection, and the others are stopped.
func (n *Node) paths(ctx context.Context, ch *channel, f *frame) (net.Conn, string, []string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		pathConn
		err error
	}
	results := make(chan result)
	try := func(path string, dial func() (net.Conn, error)) {
		go func() {
			c, err := dial()
			results <- result{pathConn{c, path}, err}
		}()
	}
	reverseFailed, directFailed := make(chan struct{}), make(chan struct{})
	wait := func(d time.Duration, failed chan struct{}) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-failed:
		case <-ctx.Done():
		}
	}
	direct, tries := 0, 0
	if len(f.addrs) > 0 {
		direct++
		try("reverse", func() (net.Conn, error) { return n.connectBack(ctx, f) })
	} else {
		close(reverseFailed)
	}
	if f.flags&flagSplice != 0 {
		direct++
		try("splice", func() (net.Conn, error) {
			return n.spliceTo(ctx, ch, f, func() { wait(spliceStagger, reverseFailed) })
		})
	}
	if direct == 0 {
		close(directFailed)
	}
	tries = direct
	if f.flags&flagNoRelay == 0 {
		tries++
		try("relay", func() (net.Conn, error) {
			wait(relayStagger, directFailed)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return n.attach(ctx, f.token)
		})
	}
	var (
		won          pathConn
		errs         []string
		directErrors int
	)
	for range tries {
		r := <-results
		switch {
		case r.err != nil && won.Conn != nil:
			// Stopped: another path won.
		case r.err != nil:
			n.log.Debug("control: a path failed", "to", f.name, "path", r.path, "err", r.err)
			errs = append(errs, r.path+": "+r.err.Error())
			if r.path == "reverse" {
				close(reverseFailed)
			}
			if r.path != "relay" {
				if directErrors++; directErrors == direct {
					close(directFailed)
				}
			}
		case won.Conn == nil:
			won = r.pathConn
			cancel() // the others stop; the dialer took this one
		default:
			r.Close() // the dialer takes one: this cannot have been it
		}
	}
	if won.Conn != nil {
		return won.Conn, won.path, nil
	}
	return nil, "", errs
}

// connectBack tries to connect to the dialer of offer f at the addresses
// the relay gave, and to attach there.
func (n *Node) connectBack(ctx context.Context, f *frame) (net.Conn, error) {
	var errs []error
	for _, a := range f.addrs {
		ctx, cancel := context.WithTimeout(ctx, reverseTimeout)
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", a.String())
		if err == nil {
			if err = attachOn(ctx, c, f.token); err != nil {
				c.Close()
			}
		}
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("could not connect back to %s at %s: %w", f.name, a, err))
	}
	return nil, errors.Join(errs...)
}

// truncate cuts s to at most max bytes, at a rune boundary.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[:max-3]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// attachOn sends attach{token} on c and waits for attached.
func attachOn(ctx context.Context, c net.Conn, token [tokenSize]byte) error {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := netconn.InterruptOnDone(ctx, c)
	_, err := c.Write((&frame{op: opAttach, token: token}).append(nil))
	var f *frame
	if err == nil {
		f, err = readFrame(c)
	}
	if err == nil && f.op != opAttached {
		err = fmt.Errorf("%w: attach answered with %s", ErrMalformed, f.op)
	}
	if !stop() && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}

// maxReverseHandshakes bounds the connections ServeReverse holds before
// they prove a token.
const maxReverseHandshakes = 64

// ServeReverse makes the node accept, on l, the connections other nodes
// make back to it when it dials them (the reverse path: through a
// firewall that blocks connections into the node dialed, no relay
// carrying bytes). The dials that follow its return offer the reverse
// path; it accepts in the background until l fails or the node is
// closed, and then closes l. A connection must open with the token of
// one of this node's dials in progress, within a few seconds; anything
// else is closed. Without ServeReverse, DialNode offers no reverse path.
func (n *Node) ServeReverse(l net.Listener) error {
	ta, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("control: ServeReverse needs a TCP listener, not %T", l.Addr())
	}
	port := uint16(ta.Port)
	n.mu.Lock()
	if n.ctx.Err() != nil {
		n.mu.Unlock()
		return net.ErrClosed
	}
	n.reversePorts = append(n.reversePorts, port)
	n.wg.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.wg.Done()
		stop := context.AfterFunc(n.ctx, func() { l.Close() })
		defer stop()
		n.acceptReverse(l)
		l.Close()
		n.mu.Lock()
		n.reversePorts = slices.DeleteFunc(n.reversePorts, func(p uint16) bool { return p == port })
		n.mu.Unlock()
	}()
	return nil
}

// acceptReverse accepts reverse connections on l until it fails.
func (n *Node) acceptReverse(l net.Listener) {
	sem := make(chan struct{}, maxReverseHandshakes)
	backoff := netconn.AcceptBackoff{Log: n.log}
	for {
		c, err := l.Accept()
		if err != nil {
			if backoff.Wait(err, n.ctx.Done()) {
				continue // out of descriptors and the like
			}
			if n.ctx.Err() == nil {
				n.log.Warn("control: no longer accepting reverse connections", "addr", l.Addr().String(), "err", err)
			}
			return
		}
		backoff.Reset()
		select {
		case sem <- struct{}{}:
		default:
			c.Close() // the slots are held by connections that proved nothing yet
			continue
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-sem }()
			n.takeReverse(c, "reverse")
		}()
	}
}

// takeReverse reads the token on a connection the node dialed made to
// this one (reverse, or spliced) and hands it to the dial waiting for it.
func (n *Node) takeReverse(c net.Conn, path string) {
	c.SetDeadline(time.Now().Add(reverseTimeout))
	f, err := readFrame(c)
	if err != nil || f.op != opAttach {
		c.Close()
		return
	}
	n.mu.Lock()
	waiting := n.reverse[f.token]
	delete(n.reverse, f.token) // single use
	n.mu.Unlock()
	if waiting == nil {
		n.log.Info("control: refused a connection from a node with an unknown token", "remote", c.RemoteAddr().String(), "path", path)
		c.Close()
		return
	}
	// The dial decides whether it takes the connection, and says so
	// (attached) only if it does.
	select {
	case waiting.conn <- pathConn{c, path}:
	case <-waiting.done: // the dial went another way, or gave up
		c.Close()
	}
}

// reverseWait is a dial waiting for the node to connect to it (back, or
// spliced).
type reverseWait struct {
	conn  chan pathConn
	punch chan netip.AddrPort // the node's splice address
	done  chan struct{}       // closed when the dial no longer waits
}

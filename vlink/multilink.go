package vlink

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// A MultiLink layer builds connections out of connections of the layers
// below it: one out of several (parallel streams), or many over one (a
// multiplexer). It splits a stack in two: the layers below it are
// negotiated by the hello of each connection it dials, the layers above
// by a second hello that the dialer sends on each connection it builds
// (the nested hello, which also carries the forwarding target). So a
// listener treats what a multi-link layer builds exactly as a connection
// it has just accepted, and stacks such as "zstd+parallel:streams=4+tcp"
// or "lz4+mux+parallel+tcp" need nothing special.
//
// A Dialer builds one MultiLink per distinct path and keeps it for later
// dials along the same path, so a layer can share what it has built (a
// multiplexed session) between dials; a MultiLink that holds connections
// between dials implements io.Closer, called by [Dialer.Close].
type MultiLink interface {
	// Dial builds one connection out of connections dialed through
	// lower, each of which reaches the peer's listener, which hands it to
	// Accept of the same layer.
	Dial(ctx context.Context, network, address string, lower Lower) (net.Conn, error)
	// Accept takes a connection that reached a listener through this
	// layer (the layers below it already applied) and gives every
	// connection it builds to j.Deliver. It owns c and must not block:
	// work that waits (for sibling connections, for streams) runs in
	// goroutines that end when their connections close or j.Done is
	// closed.
	Accept(c net.Conn, j Junction) error
}

// An EarlyDataLayer is a MultiLink whose connections may carry data
// before the listener has answered their nested hello. Its Dial returns
// as soon as the hello is sent, without waiting a round trip; the answer
// is read with the first Read, and a refusal comes back from that Read
// (as a *RefusedError inside a *net.OpError) instead of from Dial. The
// mux layer opts in: its streams exist to make short connections cheap.
type EarlyDataLayer interface {
	MultiLink
	EarlyData() bool
}

// A Lower is what a multi-link layer dials through: the rest of the stack
// down to the peer's listener.
type Lower interface {
	ContextDialer
	// Path identifies where connections dialed through Lower go and how:
	// the stack below, the peer, the credentials' fingerprint. Dials with
	// the same Path may share connections.
	Path() string
}

// A Junction is a listener's side of a multi-link layer: where the layer
// delivers what it builds, and the bounds it keeps. Its methods are safe
// for concurrent use.
type Junction interface {
	// Deliver hands a built connection to the listener, which runs the
	// nested hello on it and queues it for Accept. It blocks while the
	// listener has MaxHandshakes handshakes in progress. If the listener
	// is closed, Deliver closes c and returns net.ErrClosed.
	Deliver(c net.Conn) error
	// State returns the listener's state for the named layer, made by
	// newState the first time. Layers keep what spans connections there
	// (sessions waiting for their members), so two listeners never mix
	// them.
	State(layer string, newState func() any) any
	// Done is closed when the listener closes.
	Done() <-chan struct{}
	// Timeout bounds how long a layer may wait for the connections that
	// make up one of its own (the listener's HandshakeTimeout).
	Timeout() time.Duration
	// MaxPending bounds the connections a layer may hold while they wait
	// for their siblings (the listener's MaxHandshakes).
	MaxPending() int
	// RemoteAddr is the address of the dialer, as the listener saw it.
	RemoteAddr() net.Addr
}

// maxNesting bounds how deep multi-link layers may nest in one connection
// (mux over parallel over mux...), so a dialer cannot make a listener
// recurse without end.
const maxNesting = 4

// segments cuts mirrored layers (top first) before each multi-link layer:
// each segment is what one hello negotiates. The first segment holds the
// layers above the topmost multi-link layer (possibly none); every other
// segment starts with its multi-link layer.
func segments(mirrored []Layer) [][]Layer {
	var segs [][]Layer
	start := 0
	for i, l := range mirrored {
		if spec := lookup(l.Name); spec != nil && spec.Kind == KindMultiLink {
			segs = append(segs, mirrored[start:i])
			start = i
		}
	}
	return append(segs, mirrored[start:])
}

// multiLinkDialer dials through a MultiLink layer.
type multiLinkDialer struct {
	ml    MultiLink
	lower *lowerDialer
}

func (d *multiLinkDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.ml.Dial(ctx, network, address, d.lower)
}

type lowerDialer struct {
	ContextDialer
	path string
}

func (l *lowerDialer) Path() string { return l.path }

// pathOf names the path below a multi-link layer for Lower.Path.
func pathOf(network, peer string, below Stack, key []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", network, peer, below)
	if key != nil {
		sum := sha256.Sum256(key)
		fmt.Fprintf(&b, " key=%x", sum[:8])
	}
	return b.String()
}

// nestedHelloDialer runs the nested hello on each connection a multi-link
// layer builds. It sends no nonce: the connection is inside the hellos of
// the connections below, which authenticated it when the listener wants
// a key.
type nestedHelloDialer struct {
	next   ContextDialer
	stack  string
	target string
	early  bool // send the hello and go on: see EarlyDataLayer
}

func (d *nestedHelloDialer) DialContext(ctx context.Context, network, address string) (_ net.Conn, err error) {
	c, err := d.next.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if d.early {
		if dl, ok := ctx.Deadline(); ok {
			c.SetWriteDeadline(dl)
		}
		_, err = c.Write(helloBytes(d.stack, d.target, nil))
		c.SetWriteDeadline(time.Time{})
		if err != nil {
			c.Close()
			return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: fmt.Errorf("sending hello: %w", err)}
		}
		return &earlyConn{Conn: c, addr: addr{network, address}}, nil
	}
	if err := handshakeWithContext(ctx, c, d.stack, d.target, nil); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	return c, nil
}

// earlyConn is a connection whose nested hello is sent but not yet
// answered: its first read takes the answer.
type earlyConn struct {
	net.Conn
	addr net.Addr

	once   sync.Mutex // held while the answer is read
	done   bool
	answer error // a refusal or a failure to read the answer
}

var (
	_ net.Conn      = (*earlyConn)(nil)
	_ io.WriterTo   = (*earlyConn)(nil)
	_ io.ReaderFrom = (*earlyConn)(nil)
)

// await reads the listener's answer once; every read returns its error.
func (c *earlyConn) await() error {
	c.once.Lock()
	defer c.once.Unlock()
	if !c.done {
		m, _, err := readFrame(c.Conn, msgAccept, msgRefuse)
		switch {
		case err != nil && isTimeout(err):
			return err // the caller's read deadline: try again later
		case err != nil:
			c.answer = answerError(err)
		case m.typ == msgRefuse:
			c.answer = &RefusedError{Code: m.code, Reason: m.reason}
		}
		c.done = true
		if c.answer != nil {
			c.answer = &net.OpError{Op: "read", Net: "vlink", Addr: c.addr, Err: c.answer}
		}
	}
	return c.answer
}

func (c *earlyConn) Read(p []byte) (int, error) {
	if err := c.await(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *earlyConn) WriteTo(w io.Writer) (int64, error) {
	if err := c.await(); err != nil {
		return 0, err
	}
	return io.Copy(w, c.Conn)
}

func (c *earlyConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

func (c *earlyConn) CloseWrite() error { return netconn.CloseWrite(c.Conn) }

// layerCache keeps the multi-link layers a Dialer has built, one per path.
type layerCache struct {
	mu     sync.Mutex
	m      map[string]MultiLink
	closed bool
}

func (lc *layerCache) get(key string, build func() (MultiLink, error)) (MultiLink, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if ml, ok := lc.m[key]; ok {
		return ml, nil
	}
	ml, err := build()
	if err != nil {
		return nil, err
	}
	if lc.closed {
		// After Close the Dialer still works, but keeps nothing.
		return ml, nil
	}
	if lc.m == nil {
		lc.m = map[string]MultiLink{}
	}
	lc.m[key] = ml
	return ml, nil
}

func (lc *layerCache) close() error {
	lc.mu.Lock()
	m := lc.m
	lc.m = nil
	lc.mu.Unlock()
	var first error
	for _, ml := range m {
		if c, ok := ml.(io.Closer); ok {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// junction is a Listener's Junction for the connections one hello built.
type junction struct {
	l             *Listener
	authenticated bool
	depth         int
	remote        net.Addr
}

var _ Junction = (*junction)(nil)

func (j *junction) Deliver(c net.Conn) error {
	// A handshake slot first: a layer that builds connections faster
	// than the listener can shake hands waits here, so the handshakes a
	// dialer can make a listener hold stay bounded.
	select {
	case j.l.sem <- struct{}{}:
	case <-j.l.done:
		c.Close()
		return net.ErrClosed
	}
	if !j.l.track(c) {
		<-j.l.sem
		c.Close()
		return net.ErrClosed
	}
	j.l.wg.Add(1)
	go j.l.serveNested(c, j)
	return nil
}

func (j *junction) State(layer string, newState func() any) any {
	j.l.mu.Lock()
	defer j.l.mu.Unlock()
	if s, ok := j.l.layerState[layer]; ok {
		return s
	}
	if j.l.layerState == nil {
		j.l.layerState = map[string]any{}
	}
	s := newState()
	j.l.layerState[layer] = s
	return s
}

func (j *junction) Done() <-chan struct{}  { return j.l.done }
func (j *junction) Timeout() time.Duration { return j.l.cfg.HandshakeTimeout }
func (j *junction) MaxPending() int        { return j.l.cfg.MaxHandshakes }
func (j *junction) RemoteAddr() net.Addr   { return j.remote }

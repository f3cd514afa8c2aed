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
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

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
		if spec := lookup(l.Name); spec != nil && spec.Kind == layer.KindMultiLink {
			segs = append(segs, mirrored[start:i])
			start = i
		}
	}
	return append(segs, mirrored[start:])
}

// multiLinkDialer dials through a MultiLink layer.
type multiLinkDialer struct {
	ml    layer.MultiLink
	lower *lowerDialer
}

func (d *multiLinkDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.ml.Dial(ctx, network, address, d.lower)
}

type lowerDialer struct {
	layer.ContextDialer
	path string
}

func (l *lowerDialer) Path() string { return l.path }

// pathOf names the path below a multi-link layer for Lower.Path.
func pathOf(network, peer string, below Stack, key []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", network, peer, below)
	if sec := below.secrets(); sec != "" {
		fmt.Fprintf(&b, " secrets=%s", sec) // String shows them alike
	}
	if key != nil {
		sum := sha256.Sum256(key)
		fmt.Fprintf(&b, " key=%x", sum[:8])
	}
	return b.String()
}

// nestedHelloDialer runs the nested hello on each connection a multi-link
// layer builds. It sends no nonce and no node name: the connection is
// inside the hellos of the connections below, which authenticated it (and
// named the node) when the listener wants a key.
type nestedHelloDialer struct {
	next     layer.ContextDialer
	peer     string // the listener, for peerKey
	stack    string
	target   string
	key      []byte // for the filters of the segment; the hello carries none
	early    bool   // send the hello and go on: see layer.EarlyDataLayer
	datagram bool   // the hello opens a datagram session (Hello.Datagram)
	lookup   bool   // the hello is a lookup: see Dialer.LookupHost
	// peerKey, set when this segment is the first encrypted one, checks
	// the static key the listener announces (see helloDialer).
	peerKey PeerKeyCallback
}

func (d *nestedHelloDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, _, err := d.dialSegment(ctx, network, address)
	return c, err
}

func (d *nestedHelloDialer) dialSegment(ctx context.Context, network, address string) (_ net.Conn, hs layer.Handshake, err error) {
	c, err := d.next.DialContext(ctx, network, address)
	if err != nil {
		return nil, hs, err
	}
	if d.early && !d.lookup {
		if dl, ok := ctx.Deadline(); ok {
			c.SetWriteDeadline(dl)
		}
		_, err = c.Write(helloBytes(&message{stack: d.stack, target: d.target, dgram: d.datagram, wait: targetWait(ctx, d.target, false, d.datagram)}, nil))
		c.SetWriteDeadline(time.Time{})
		if err != nil {
			c.Close()
			return nil, hs, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: fmt.Errorf("sending hello: %w", err)}
		}
		return &earlyConn{Conn: c, addr: addr{network, address}}, hs, nil
	}
	transcript, acc, err := handshakeWithContext(ctx, c, &message{stack: d.stack, target: d.target, lookup: d.lookup, dgram: d.datagram,
		wait: targetWait(ctx, d.target, d.lookup, d.datagram)}, nil, nil)
	if err == nil && d.peerKey != nil && !d.lookup {
		err = d.peerKey(d.peer, acc.static)
	}
	if err != nil {
		c.Close()
		return nil, hs, &net.OpError{Op: "dial", Net: "vlink", Addr: addr{network, address}, Err: err}
	}
	if d.lookup {
		return &lookupAnswer{Conn: c, family: acc.family}, hs, nil
	}
	return c, layer.Handshake{Key: d.key, Transcript: transcript, PeerStatic: acc.static}, nil
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
	_ net.Conn        = (*earlyConn)(nil)
	_ io.WriterTo     = (*earlyConn)(nil)
	_ io.ReaderFrom   = (*earlyConn)(nil)
	_ netconn.Aborter = (*earlyConn)(nil)
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

// Abort aborts the stream below (see netconn.Abort). earlyConn cannot
// let netconn find that stream itself: it is no netconn.Unwrapper, since
// its reads take the answer first.
func (c *earlyConn) Abort() error { return netconn.Abort(c.Conn) }

// layerCache keeps the multi-link layers a Dialer has built, one per path.
type layerCache struct {
	mu     sync.Mutex
	m      map[string]layer.MultiLink
	closed bool
	// statics: the static keys listeners proved, for first flights
	// (firstflight.go).
	statics staticKeys
}

func (lc *layerCache) get(key string, build func() (layer.MultiLink, error)) (layer.MultiLink, error) {
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
		lc.m = map[string]layer.MultiLink{}
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
	node          string                // the node the connections' hello proved, if any
	key           []byte                // the key it proved, for the nested segments' filters
	cert          *nodecert.Certificate // the certificate it proved, if any
	depth         int
	remote        net.Addr // the origin, for a connection through route layers
	forwarded     int      // the nodes the connections crossed (Hello.Forwarded)
	clear         bool     // the nested hellos must bring encryption (Hello.clear)
	unproven      bool     // no encryption below proved the identity (Hello.unproven)
	session       Stack    // the members' layers, from the multi-link layer down (Hello.Session)
}

var _ layer.Junction = (*junction)(nil)

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

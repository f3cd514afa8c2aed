package layers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/layer/layertest"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A fixture gives the stack a layer is tested with, starting whatever the
// layer needs (a proxy, an SSH server) and stopping it through t.Cleanup.
// Layers that need more than their defaults add theirs to fixtures from
// their own file (conformance_NAME_test.go), in an init function.
//
// losesAborts says that a server on the fixture's path ends one side
// with a FIN however the other side ended (an SSH server closes a
// channel's target so), so an abort reaches the peer as a clean end; the
// abort check then says so instead of failing (layertest.Options).
type fixture func(t *testing.T) (s vlink.Stack, losesAborts bool)

var fixtures = map[string]fixture{}

// A venue is where a stack's pipes are made. The zero venue is a vlink
// listener on a loopback port, dialed at its address; the factories
// that reach nodes need a vlink network (conformance_rendezvous_test.go),
// and those with a transport of their own (shm) a listener on it, which
// they add to venues, like fixtures, under their layer's name.
type venue struct {
	// listen returns the listener the vlink listener wraps, and the
	// address to dial it at.
	listen func() (net.Listener, string, error)
	// network is the dialer's Network.
	network vlink.NodeDialer
	// targets are what the listener's policy lets a hello name.
	targets []selector.Rule
}

var venues = map[string]func(t *testing.T) venue{}

// A subject is a stack to test and where to test it.
type subject struct {
	stack       vlink.Stack
	venue       venue
	losesAborts bool // see fixture
}

// stacks returns one stack per registered layer, so a layer is covered the
// day it registers. Filters, multi-link layers and terminal factories are
// tested with their defaults; any other layer must have a fixture, and a
// factory that reaches nodes a venue: the test fails until it has one.
func stacks(t *testing.T) map[string]subject {
	out := map[string]subject{}
	for _, spec := range layer.Specs() {
		var v venue
		if mk, ok := venues[spec.Name]; ok {
			v = mk(t)
		} else if spec.Nodes {
			t.Errorf("layer %s reaches nodes and has no venue: add one to vlink/layers (conformance_%s_test.go)", spec.Name, spec.Name)
			continue
		}
		switch fx, ok := fixtures[spec.Name]; {
		case ok:
			st, lost := fx(t)
			out[spec.Name] = subject{st, v, lost}
		case spec.Kind == layer.KindFilter, spec.Kind == layer.KindMultiLink:
			out[spec.Name] = subject{stack: vlink.MustParse(spec.Name), venue: v}
		case spec.Kind == layer.KindFactory && spec.Terminal:
			out[spec.Name] = subject{stack: vlink.MustParse(spec.Name), venue: v}
		default:
			t.Errorf("layer %s (%s) has no conformance fixture: add one to vlink/layers (conformance_%s_test.go)", spec.Name, spec.Kind, spec.Name)
		}
	}
	// Deeper stacks, so layering itself is covered.
	deeper := func(s string) { out[s] = subject{stack: vlink.MustParse(s)} }
	deeper("zstd+identity+lz4")
	if _, ok := layer.Lookup("parallel"); ok {
		deeper("lz4+parallel:streams=3+zstd")
	}
	if _, ok := layer.Lookup("mux"); ok {
		deeper("zstd+mux+parallel:streams=2")
	}
	if _, ok := layer.Lookup("noise"); ok {
		// Compression above encryption.
		deeper("zstd+noise")
		deeper("noise+mux+noise")
	}
	return out
}

// testKey is the pre-shared key of both sides for stacks with a layer
// that needs one (noise).
var testKey = []byte("conformance pre-shared key")

func needsKey(s vlink.Stack) bool {
	for _, l := range s.Layers {
		if spec, ok := layer.Lookup(l.Name); ok {
			if v, err := spec.Build(l.Params); err == nil {
				if _, ok := v.(layer.HandshakeFilter); ok {
					return true
				}
			}
		}
	}
	return false
}

// endMarker reports whether a layer of the stack declares end markers
// (layer.Spec.EndMarker): then a stream cut below the stack is an error
// at its reader.
func endMarker(s vlink.Stack) bool {
	for _, l := range s.Layers {
		if spec, ok := layer.Lookup(l.Name); ok && spec.EndMarker {
			return true
		}
	}
	return false
}

// pipe makes a connected pair through a subject's stack, at its venue:
// the dialed end and the accepted end, each as a program gets it. Where
// the connections the listener accepts are TCP (the zero venue), the
// pipe can cut the stream below the stack: the acceptor's stream with a
// FIN from its TCP connections, the dialer's by shutting down the
// reading side of the acceptor's (its layers read the end a FIN would
// bring). Elsewhere it cannot, and the truncation check says so.
func pipe(s subject) (layertest.Pipe, error) {
	var key []byte
	if needsKey(s.stack) {
		key = testKey
	}
	listen := s.venue.listen
	if listen == nil {
		listen = func() (net.Listener, string, error) {
			l, err := vlink.ListenStack(context.Background(), vlink.Stack{}, "tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return l, l.Addr().String(), nil
		}
	}
	inner, addr, err := listen()
	if err != nil {
		return layertest.Pipe{}, err
	}
	below := &capture{Listener: inner}
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Targets: s.venue.targets}}
	l, err := lc.NewListener(below)
	if err != nil {
		inner.Close()
		return layertest.Pipe{}, err
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	// The Dialer keeps what multi-link layers share (a mux session)
	// until it is closed.
	d := &vlink.Dialer{Stack: s.stack, Key: key, Network: s.venue.network}
	c1, err := d.Dial("tcp", addr)
	if err != nil {
		l.Close()
		<-ch
		d.Close()
		return layertest.Pipe{}, err
	}
	r := <-ch
	l.Close()
	if r.err != nil {
		c1.Close()
		d.Close()
		return layertest.Pipe{}, r.err
	}
	p := layertest.Pipe{
		Dialer:   c1,
		Acceptor: r.c,
		Stop:     func() { c1.Close(); r.c.Close(); d.Close() },
	}
	if below.tcp() == nil && s.venue.listen == nil {
		// The zero venue listens on TCP: a pipe there that cannot cut
		// would skip the truncation check unseen.
		p.Stop()
		return layertest.Pipe{}, fmt.Errorf("the pipe cannot cut below its stack: its listener accepted %s, not TCP connections only", below.types())
	}
	if below.tcp() != nil {
		// A multi-link layer may have ended some of its connections
		// (parallel's auto growth): the cut is of those still open.
		p.Cut = func(from net.Conn) error {
			var errs []error
			for _, c := range below.tcp() {
				cut := c.CloseWrite
				if from == c1 {
					cut = c.CloseRead
				}
				if err := cut(); err != nil {
					errs = append(errs, err)
				}
			}
			if len(errs) == len(below.tcp()) {
				return errors.Join(errs...)
			}
			return nil
		}
	}
	return p, nil
}

// capture is a listener that keeps the connections it accepts: those
// below the stack of a pipe.
type capture struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *capture) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// types lists the types of the connections accepted so far.
func (l *capture) types() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ts []string
	for _, c := range l.conns {
		ts = append(ts, fmt.Sprintf("%T", c))
	}
	return fmt.Sprint(ts)
}

// tcp returns the connections accepted so far if each is TCP, else nil.
func (l *capture) tcp() []*net.TCPConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*net.TCPConn
	for _, c := range l.conns {
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return nil
		}
		out = append(out, tc)
	}
	return out
}

// TestConformance runs package layertest's suite (nettest's TestConn,
// errors, transfers, aborts, truncation) on every stack the registry
// can build, at its venue.
func TestConformance(t *testing.T) {
	for name, s := range stacks(t) {
		t.Run(name, func(t *testing.T) {
			opts := layertest.Options{EndMarker: endMarker(s.stack), LosesAborts: s.losesAborts}
			layertest.TestConn(t, func() (layertest.Pipe, error) { return pipe(s) }, opts)
		})
	}
}

// TestListener checks the net.Listener contract of VLink listeners:
// Close unblocks Accept with net.ErrClosed, Accept after Close fails the
// same way, Addr stays valid, concurrent Accepts each get a connection.
func TestListener(t *testing.T) {
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	const n = 4
	got := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			c, err := l.Accept()
			if err == nil {
				c.Close()
			}
			got <- err
		}()
	}
	for i := 0; i < n; i++ {
		d := vlink.Dialer{Stack: vlink.MustParse("zstd")}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for i := 0; i < n; i++ {
		if err := <-got; err != nil {
			t.Fatalf("concurrent Accept: %v", err)
		}
	}
	blocked := make(chan error, 1)
	go func() { _, err := l.Accept(); blocked <- err }()
	time.Sleep(10 * time.Millisecond)
	l.Close()
	select {
	case err := <-blocked:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if l.Addr().String() != addr {
		t.Fatal("Addr changed after Close")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("port still accepting after Close")
	}
}

package layer

import (
	"context"
	"errors"
	"net"
	"time"
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
// A vlink.Dialer builds one MultiLink per distinct path and keeps it for later
// dials along the same path, so a layer can share what it has built (a
// multiplexed session) between dials; a MultiLink that holds connections
// between dials implements io.Closer, called by vlink.Dialer.Close.
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

// A Reserver is a MultiLink that holds the connections it accepts until
// their siblings arrive (parallel's substreams wait for the rest of their
// session), within bounds of its own. A listener calls Reserve before it
// accepts the hello of a connection for the layer, so a layer with no
// room refuses that hello (as busy) and the dialer learns why: dropping
// a connection whose hello was accepted would leave the dialer waiting
// for the handshake timeout, then reporting a peer that is no listener.
// After a successful Reserve the listener calls either Accept with the
// same junction, which takes the reservation over, or release.
type Reserver interface {
	MultiLink
	Reserve(j Junction) (release func(), err error)
}

// ErrBusy is matched by the error of a Reserver with no room left.
// Package vlink refuses the hello with its busy code, and a dialer's
// refusal matches the same error (vlink.ErrBusy).
var ErrBusy = errors.New("listener busy")

// An EarlyDataLayer is a MultiLink whose connections may carry data
// before the listener has answered their nested hello. Its Dial returns
// as soon as the hello is sent, without waiting a round trip; the answer
// is read with the first Read, and a refusal comes back from that Read
// (as a *vlink.RefusedError inside a *net.OpError) instead of from Dial. The
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
	// listener has vlink.ListenConfig.MaxHandshakes handshakes in progress. If the listener
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

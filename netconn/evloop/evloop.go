// Package evloop forwards the TCP connections a listener accepts to one
// address, as an event-driven proxy does (HAProxy in TCP mode): one
// goroutine accepts, connects and relays with epoll(7), blocking its
// thread in epoll_wait(2), so a short connection costs no goroutine start
// and no hand-off between threads. On a machine where each thread
// wake-up is dear (a virtual machine, two cores) that is most of what a
// Go relay spends on a short connection (docs/BENCHMARKS.md §3, "Connect
// to first byte, out of process").
//
// The loop copies with read(2) and write(2) through one buffer. A
// connection that carries more than BulkBytes either way, or whose
// destination cannot take what the loop read at once, moves to
// netconn.Relay on goroutines of its own, which splices: the loop is for
// the start of every connection and the whole of short ones, the
// goroutine relay for bulk.
//
// The relay keeps netconn.Relay's contract: an end is passed on as a
// half-close, a failure as a reset of both connections (also the reset
// the kernel reports as an end of stream to a read when a write took its
// error), and a peer that reset after its own end ended normally.
//
// Linux only: elsewhere Listen returns ErrUnsupported and callers relay
// on goroutines.
package evloop

import (
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// BulkBytes is how many bytes a direction carries in the loop before its
// connection moves to the splicing relay.
const BulkBytes = 64 << 10

// ErrUnsupported is returned by Listen where there is no event loop
// (outside Linux).
var ErrUnsupported = errors.New("evloop: not supported on this system")

// Config says where a Loop's connections go and how their sockets are
// set up. The zero value is not usable: Target is required.
type Config struct {
	// Target is the address every accepted connection is connected to.
	Target netip.AddrPort
	// DialTimeout bounds each connect to Target. Zero: the kernel's
	// (about two minutes).
	DialTimeout time.Duration
	// KeepAlive configures the accepted connections' keep-alives. The
	// zero value enables them as net.ListenConfig's zero value does (15 s
	// idle and interval, 9 probes); Enable false with a nonzero field, or
	// a negative Idle, disables them.
	KeepAlive net.KeepAliveConfig
	// DialControl, if not nil, is called with each socket dialing Target
	// before it connects, to set its options (tcp.Factory.PrepareSocket).
	// Only the RawConn's Control works. Nil: TCP_NODELAY and keep-alives
	// are set as net.Dialer's zero value sets them (15 s idle and
	// interval, 9 probes).
	DialControl func(rc syscall.RawConn) error
}

// Validate reports what makes c unusable.
func (c Config) Validate() error {
	switch {
	case !c.Target.IsValid() || c.Target.Port() == 0:
		return errors.New("evloop: Target must be an IP address and a port")
	case c.DialTimeout < 0:
		return errors.New("evloop: negative DialTimeout")
	}
	return nil
}

// A Handler follows a Loop's connections. Its methods are called on the
// loop's goroutine, or for a connection that moved to the splicing relay,
// Ended on that relay's goroutine: they must be safe for concurrent use
// and return quickly, since the loop serves nothing else meanwhile.
type Handler interface {
	// Accepted is called for each connection accepted, before it is
	// connected on. False refuses it: it is reset.
	Accepted(c *Conn) bool
	// Dialed reports the connect to Target: nil, or why it failed (the
	// accepted connection is then reset, and Ended is not called).
	Dialed(c *Conn, took time.Duration, err error)
	// Ended reports the end of a connection's relay once both of its
	// sockets are closed: nil, or the first failure either way (both
	// were reset). Conn's byte counts are final.
	Ended(c *Conn, err error)
}

// A Conn is one accepted connection and its connection to Target.
type Conn struct {
	// Remote is the accepted connection's peer, Local its local address.
	Remote, Local netip.AddrPort
	// Up is what the relay carried from the accepted connection to
	// Target, Down back; final when Ended is called.
	Up, Down int64
	// Value is the Handler's, for its own state.
	Value any
	// Aborted is set when the connection was reset by Loop.Abort.
	Aborted bool

	up, down atomic.Int64 // for Carried
	// moved is the accepted connection once in the splicing relay.
	moved atomic.Pointer[net.TCPConn]
}

// Carried returns the bytes carried so far each way. Unlike Up and Down
// it may be called at any time, from any goroutine.
func (c *Conn) Carried() (up, down int64) {
	up, down = c.up.Load(), c.down.Load()
	if tc := c.moved.Load(); tc != nil {
		// In the splicing relay: the kernel counts what the client
		// sent and what it acknowledged.
		if k, ok := netconn.ReadTCPCounts(tc); ok {
			acked, received := k.Data(false)
			up, down = max(up, int64(received)), max(down, int64(acked))
		}
	}
	return up, down
}

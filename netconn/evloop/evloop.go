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
// With a Greeter (Config.Greeter), the loop first waits for each
// connection's first bytes and lets the Greeter say where it goes, and
// what to answer once there: a gateway that takes its protocol's hello on
// the loop (vlink serve). A connection the Greeter does not take is
// handed off, its bytes unread, to whoever calls Accept.
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

// ErrClientLeft is what Handler.Dialed reports of a connect given up
// because the accepted connection hung up while it was in progress: it
// was reset, or it ended with nothing unread (a client that sent more
// after its greeting, then half-closed, waits for its answer).
var ErrClientLeft = errors.New("evloop: the client hung up before its target answered")

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
	// Greeter, if not nil, reads each connection's first bytes before it
	// is connected on: Target is then the Greeter's for each connection,
	// and Config's is not used. The connections it does not take are
	// handed off to Accept.
	Greeter Greeter
	// GreetTimeout is how long a connection may take to send the bytes
	// its Greeter reads, before it is handed off. Zero means
	// DefaultGreetTimeout.
	GreetTimeout time.Duration
	// HandOff, if not nil, is given each connection the Greeter hands
	// off, on the loop's goroutine: it must return at once (start the
	// connection's handling on a goroutine of its own, as
	// vlink.Listener.Take does), which spares the hand-off through
	// Accept one wake-up of another goroutine. False leaves the
	// connection to Accept.
	HandOff func(c net.Conn) bool
	// MaxConnecting, if positive, bounds the Greeter's connections whose
	// connect to their target is in progress at once: past it, new
	// connections are handed off without a greeting, bytes unread, so
	// that whoever takes them applies its own bound (a vlink.Listener's
	// MaxHandshakes parks or sheds them). Zero: only descriptors and the
	// connects' deadlines bound them.
	MaxConnecting int
}

// DefaultGreetTimeout is a zero Config.GreetTimeout: a dialer sends its
// hello at once, in one write, so a connection still silent this long
// after its accept goes the long way (a client waiting for the server to
// speak first, a slow or hostile one).
const DefaultGreetTimeout = 20 * time.Millisecond

// MaxGreeting is the most a Greeter is shown of a connection's first
// bytes.
const MaxGreeting = 8 << 10

// A Greeter decides where a connection goes from the bytes it sent
// first, on the loop's goroutine: it must return quickly and make no
// system call that blocks.
type Greeter interface {
	// Greet is called once the connection's first bytes arrived, with
	// those queued (peeked: none is consumed yet), at most MaxGreeting,
	// in the loop's buffer: valid only during the call. False hands the
	// connection off, every byte still unread.
	Greet(c *Conn, first []byte) (Greeting, bool)
	// Refusal returns what to send a connection whose Greeting's target
	// could not be reached, before the connection is closed: nil
	// resets it.
	Refusal(c *Conn, err error) []byte
}

// A Greeting is where a Greeter sends a connection.
type Greeting struct {
	// Target is where the connection is connected on.
	Target netip.AddrPort
	// Consume is how many of the first bytes the greeting took: they
	// are read and dropped before the relay starts.
	Consume int
	// Reply is sent to the connection once Target is connected, before
	// anything relayed.
	Reply []byte
	// Deadline bounds the connect to Target. Zero: DialTimeout's.
	Deadline time.Time
	// Control, if not nil, is called with the accepted socket before the
	// connect, to set its options (a congestion control).
	Control func(rc syscall.RawConn) error
}

// Validate reports what makes c unusable.
func (c Config) Validate() error {
	switch {
	case c.Greeter == nil && (!c.Target.IsValid() || c.Target.Port() == 0):
		return errors.New("evloop: Target must be an IP address and a port")
	case c.GreetTimeout < 0:
		return errors.New("evloop: negative GreetTimeout")
	case c.DialTimeout < 0:
		return errors.New("evloop: negative DialTimeout")
	case c.MaxConnecting < 0:
		return errors.New("evloop: negative MaxConnecting")
	}
	return nil
}

// A Handler follows a Loop's connections. Its methods are called on the
// loop's goroutine, or for a connection that moved to the splicing relay,
// Ended on that relay's goroutine: they must be safe for concurrent use
// and return quickly, since the loop serves nothing else meanwhile.
type Handler interface {
	// Accepted is called for each connection accepted, before it is
	// connected on (with a Greeter: once it took the connection). False
	// refuses it: it is reset.
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
	// Remote is the accepted connection's peer.
	Remote netip.AddrPort
	// Target is where the connection goes: Config.Target, or its
	// Greeting's.
	Target netip.AddrPort
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

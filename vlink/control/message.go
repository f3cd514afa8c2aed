package control

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/vlink-dev/vlink/vlink"
)

// A Type says what a message means. As in Paradis-Net, the sender and
// the receiver agree on the types at design time; the receiver registers
// a handler per type ([Node.Handle]).
type Type uint16

// FirstReserved is the first type vlink keeps for itself (the reverse
// and relay factories' requests). Programs use types 1 to FirstReserved-1.
const FirstReserved Type = 0xff00

// A Message is a message delivered to a handler or to a [Cooperation].
type Message struct {
	// From is the node that sent the message, as the relay authenticated
	// it. For a forwarded message it is the origin, which the relay
	// checked had sent the forwarder this cooperation's message.
	From string
	// Via is the node that forwarded the message; empty when From sent
	// it directly.
	Via     string
	Type    Type
	Payload []byte

	coop  uint64
	node  *Node
	peer  *Peer  // a lookup's answer
	ready *frame // a relay's ready
}

// Reply sends a message back to m's sender, within m's cooperation: it
// reaches the Cooperation waiting for it rather than a handler.
func (m *Message) Reply(ctx context.Context, t Type, payload []byte) error {
	return m.node.send(ctx, &frame{op: opSend, typ: t, coop: m.coop, name: m.From, payload: payload})
}

// Forward hands m to another node, which receives it with m's sender as
// From and this node as Via, and answers the sender directly
// (Paradis-Net's delegation): the obligation to answer moves with it.
func (m *Message) Forward(ctx context.Context, to string) error {
	if err := checkName(to); err != nil {
		return err
	}
	return m.node.send(ctx, &frame{op: opForward, typ: m.Type, coop: m.coop, name: to, name2: m.From, payload: m.Payload})
}

// A Code says why the relay could not deliver a message.
type Code uint8

const (
	// CodeNoNode: no node of that name is online.
	CodeNoNode Code = iota + 1
	// CodeBusy: the destination's queue, or the relay's, is full.
	CodeBusy
	// CodeForbidden: the relay does not allow it (a forward on behalf of
	// an origin that sent the forwarder nothing).
	CodeForbidden
	// CodeRefused: the node does not take connections to that port.
	CodeRefused
	// CodeTimeout: the node did not answer in time.
	CodeTimeout
	// CodeUnreachable: no path the dial allowed reached the dialer (the
	// node could not connect back, nor splice), and the dial forbade
	// the relay to carry the connection.
	CodeUnreachable
	// codeDirect, in a decline: the node reached the dialer itself
	// (connected back, or spliced), the relay has nothing to carry.
	codeDirect
	codeLimit
)

func (c Code) String() string {
	switch c {
	case CodeNoNode:
		return "no such node"
	case CodeBusy:
		return "busy"
	case CodeForbidden:
		return "forbidden"
	case CodeRefused:
		return "refused"
	case CodeTimeout:
		return "timed out"
	case CodeUnreachable:
		return "unreachable"
	}
	return fmt.Sprintf("code %d", uint8(c))
}

// Errors a program can test with errors.Is. A use after Close is
// net.ErrClosed.
var (
	ErrNoNode    = errors.New("control: no such node online")
	ErrBusy      = errors.New("control: busy, try again later")
	ErrForbidden = errors.New("control: not allowed")
	ErrRefused   = errors.New("control: connection refused by the node")
	ErrTimeout   = errors.New("control: the node did not answer in time")
	// ErrUnreachable: no path the dial allows reaches the node.
	ErrUnreachable = errors.New("control: no allowed path reaches the node")
)

// A DeliveryError says that the relay could not deliver a message to a
// node. It matches ErrNoNode, ErrBusy, ErrForbidden, ErrRefused,
// ErrTimeout or ErrUnreachable.
type DeliveryError struct {
	To     string
	Code   Code
	Reason string
}

func (e *DeliveryError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("control: delivering to %s: %s (%s)", e.To, e.Code, e.Reason)
	}
	return fmt.Sprintf("control: delivering to %s: %s", e.To, e.Code)
}

// Unwrap returns the sentinel of e's code; a refusal also matches
// syscall.ECONNREFUSED, a timeout os.ErrDeadlineExceeded and an
// unreachable node syscall.EHOSTUNREACH, as their direct equivalents
// would.
func (e *DeliveryError) Unwrap() []error {
	switch e.Code {
	case CodeNoNode:
		return []error{ErrNoNode}
	case CodeBusy:
		return []error{ErrBusy}
	case CodeForbidden:
		return []error{ErrForbidden}
	case CodeRefused:
		return []error{ErrRefused, syscall.ECONNREFUSED}
	case CodeTimeout:
		return []error{ErrTimeout, os.ErrDeadlineExceeded}
	case CodeUnreachable:
		return []error{ErrUnreachable, syscall.EHOSTUNREACH}
	}
	return nil
}

// ValidName reports whether name can name a node: a DNS label (1 to 63
// lower-case letters, digits and '-', starting with a letter, not ending
// with '-').
func ValidName(name string) bool { return vlink.ValidNodeName(name) }

func checkName(name string) error {
	if !ValidName(name) {
		return fmt.Errorf("control: %q is not a node name (1-63 lower-case letters, digits and '-', starting with a letter)", name)
	}
	return nil
}

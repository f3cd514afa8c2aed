package vlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Errors a program can test with errors.Is. Refusals from a peer come as a
// *RefusedError, which matches ErrRefused and the sentinel of its code.
var (
	// ErrRefused is matched by every refusal from a VLink peer.
	ErrRefused = errors.New("refused by peer")
	// ErrAuth is matched when authentication is required, fails, or the
	// peer cannot prove it holds the key. It is layer.ErrAuth, which
	// layers wrap too (a proxy that rejects the credentials).
	ErrAuth = layer.ErrAuth
	// ErrNotAllowed is matched when the peer's policy forbids a layer, a
	// parameter value or a forwarding target. It is layer.ErrNotAllowed.
	ErrNotAllowed = layer.ErrNotAllowed
	// ErrUnreachable is matched when a forwarding peer could not reach the
	// target. It is layer.ErrUnreachable.
	ErrUnreachable = layer.ErrUnreachable
	// ErrBusy is matched when the peer is out of room for the connection
	// (a multi-link layer's table is full, or it is shutting down): try
	// again later. It is layer.ErrBusy, which layers wrap too.
	ErrBusy = layer.ErrBusy
	// ErrNotVLink is matched when the peer did not answer the hello as a
	// VLink listener does (a plain server, or a proxy in the way).
	ErrNotVLink = errors.New("peer is not a vlink listener")
	// ErrDirectRefused is matched when the user's rules refuse a
	// destination. It is layer.ErrDirectRefused.
	ErrDirectRefused = layer.ErrDirectRefused
	// ErrLoop is matched when a connection would cross a node twice on
	// its way through route layers (fwd), or more than MaxHops nodes.
	ErrLoop = errors.New("forwarding loop")

	// ErrNoDatagrams is matched by the error of a datagram dial (network
	// "udp") whose route cannot carry datagrams: a best-effort route, or
	// a stack without a gateway (or node) to relay them.
	ErrNoDatagrams = errors.New("this route carries no datagrams")
	// ErrKeyRequired is matched when a stack holds a layer that needs the
	// pre-shared key (an encryption layer such as noise) and no key is
	// configured. It is layer.ErrKeyRequired.
	ErrKeyRequired = layer.ErrKeyRequired
	// ErrPlainRefused is matched by a listener's handshake error for a
	// connection that sent no hello where its policy refuses plain
	// connections (see ListenConfig.Observe).
	ErrPlainRefused = errors.New("plain connection refused by policy")
	// ErrShed is the handshake error a listener reports for a connection
	// it closed in the middle of its handshake to make room for others
	// (see ListenConfig.MaxHandshakes and ListenConfig.Observe).
	ErrShed = errors.New("closed mid-handshake to make room for another")
)

// RefuseCode says why a listener refused a connection.
type RefuseCode uint8

const (
	CodeMalformed    RefuseCode = 1  // the hello did not parse
	CodeVersion      RefuseCode = 2  // unsupported protocol version
	CodeAuthRequired RefuseCode = 3  // the listener requires a pre-shared key
	CodeAuthFailed   RefuseCode = 4  // the proof did not match the key
	CodeLayer        RefuseCode = 5  // a layer is unknown or not allowed
	CodeParam        RefuseCode = 6  // a parameter is outside the policy's bounds
	CodeTarget       RefuseCode = 7  // the forwarding target is not allowed
	CodeUnreachable  RefuseCode = 8  // the forwarding target could not be reached
	CodeBusy         RefuseCode = 9  // the listener is overloaded or shutting down
	CodeRejected     RefuseCode = 10 // the application rejected the connection
	CodeLoop         RefuseCode = 11 // the connection already crossed this node, or too many
	CodeNoSuchHost   RefuseCode = 12 // a lookup's host does not resolve (Dialer.LookupHost)
	// The forwarding target could not be reached, as the listener's own
	// dial said, so that the dialer's program gets the errno it would
	// have got itself (TargetRefusal): CodeUnreachable for a host or
	// network that cannot be reached (EHOSTUNREACH), CodeTargetRefused
	// for a port nobody listens on (ECONNREFUSED), CodeTargetTimeout for
	// a host that never answered (ETIMEDOUT). All three match
	// ErrUnreachable. A dialer older than these codes shows their number.
	CodeTargetRefused RefuseCode = 13
	CodeTargetTimeout RefuseCode = 14
)

var codeText = map[RefuseCode]string{
	CodeMalformed:     "malformed hello",
	CodeVersion:       "unsupported version",
	CodeAuthRequired:  "authentication required",
	CodeAuthFailed:    "authentication failed",
	CodeLayer:         "layer not allowed",
	CodeParam:         "parameter not allowed",
	CodeTarget:        "target not allowed",
	CodeUnreachable:   "target unreachable",
	CodeBusy:          "busy",
	CodeRejected:      "rejected",
	CodeLoop:          "forwarding loop",
	CodeNoSuchHost:    "no such host",
	CodeTargetRefused: "target refused the connection",
	CodeTargetTimeout: "target timed out",
}

func (c RefuseCode) String() string {
	if s, ok := codeText[c]; ok {
		return s
	}
	return fmt.Sprintf("refusal %d", uint8(c))
}

func (c RefuseCode) sentinel() error {
	switch c {
	case CodeMalformed, CodeVersion:
		return ErrBadHello
	case CodeAuthRequired, CodeAuthFailed:
		return ErrAuth
	case CodeLayer, CodeParam, CodeTarget:
		return ErrNotAllowed
	case CodeUnreachable, CodeTargetRefused, CodeTargetTimeout:
		return ErrUnreachable
	case CodeBusy:
		return ErrBusy
	case CodeLoop:
		return ErrLoop
	}
	return nil
}

// A HandshakeError is how a listener's VLink handshake failed once its
// hello was read, as ListenConfig.Observe is told. Stack is the stack
// the hello named, as the dialer wrote it: only a claim, made before
// the dialer proved a key or the policy was asked, so whatever keeps
// it (a metric's label) bounds what it keeps. Err is the failure: a
// *RefusedError when refused.
type HandshakeError struct {
	Stack string
	Err   error
}

func (e *HandshakeError) Error() string { return e.Err.Error() }
func (e *HandshakeError) Unwrap() error { return e.Err }

// withStack wraps a handshake's failure err in a *HandshakeError naming
// stack, unless an inner hello's failure named its own already.
func withStack(err error, stack string) error {
	var he *HandshakeError
	if err == nil || errors.As(err, &he) {
		return err
	}
	return &HandshakeError{Stack: stack, Err: err}
}

// A RefusedError is a refusal received from (or sent to) a peer.
type RefusedError struct {
	Code   RefuseCode
	Reason string // the listener's explanation, for a person
	// Hop says which node refused a connection that goes through route
	// layers (fwd), counted from the dialer: 1 is the node it dialed,
	// then each node the hello names in turn; 0 when there was no route.
	// HopAddr is that node's address, as the dialer named it.
	Hop     int
	HopAddr string
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	b.WriteString(ErrRefused.Error())
	if e.Hop > 0 {
		fmt.Fprintf(&b, " at hop %d", e.Hop)
		if e.HopAddr != "" {
			fmt.Fprintf(&b, " (%s)", e.HopAddr)
		}
	}
	fmt.Fprintf(&b, ": %v", e.Code)
	if e.Reason != "" {
		fmt.Fprintf(&b, ": %s", e.Reason)
	}
	return b.String()
}

// errno is what a program's own connect would have returned for the
// failure a code reports, or 0.
func (c RefuseCode) errno() syscall.Errno {
	switch c {
	case CodeUnreachable, CodeNoSuchHost:
		return syscall.EHOSTUNREACH
	case CodeTargetRefused:
		return syscall.ECONNREFUSED
	case CodeTargetTimeout:
		return syscall.ETIMEDOUT
	}
	return 0
}

// Is makes a refusal match ErrRefused, its code's sentinel and, for a
// target the listener could not reach, the errno its dial got
// (syscall.ECONNREFUSED, ETIMEDOUT or EHOSTUNREACH).
func (e *RefusedError) Is(target error) bool {
	if en, ok := target.(syscall.Errno); ok {
		return en != 0 && en == e.Code.errno()
	}
	return target == ErrRefused || (target != nil && target == e.Code.sentinel())
}

// TargetRefusal is the refusal of a listener whose dial to the
// forwarding target failed with err: its code says how (refused, timed
// out, unreachable), so the dialer's program gets that errno.
func TargetRefusal(err error) *RefusedError {
	code := CodeUnreachable
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		code = CodeTargetRefused
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		code = CodeTargetTimeout
	}
	return &RefusedError{Code: code, Reason: err.Error()}
}

func refuse(code RefuseCode, format string, args ...any) *RefusedError {
	return &RefusedError{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// addr is a net.Addr for an address we only have as a string.
type addr struct{ net, s string }

func (a addr) Network() string { return a.net }
func (a addr) String() string  { return a.s }

var _ net.Addr = addr{}

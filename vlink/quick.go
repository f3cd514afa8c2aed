package vlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"
)

// A QuickHello is a hello a Listener answered from the bytes its
// connection sent first, with no goroutine and no system call of its own
// (Listener.QuickHello), for an event loop that serves the connection
// itself: it dials the target, sends Accept, and relays.
type QuickHello struct {
	// Hello is what the dialer asked for, past the listener's policy.
	Hello *Hello
	// Len is how many of the bytes given the magic and the hello took:
	// read and drop them before relaying. The dialer's own bytes, if it
	// sent any after its hello, follow.
	Len int
	// Accept is the frame to send once the target is reached.
	Accept []byte
	// Deadline is when the handshake would give up on the target, counted
	// from the connection's accept: HandshakeTimeout, or the dialer's
	// TargetWait as far as MaxTargetWait lets it.
	Deadline time.Time

	log      *slog.Logger
	accepted time.Time
}

// Refusal returns the frame that refuses the dialer when reaching its
// target failed with err: a *RefusedError as it is, any other error as
// CodeRejected, as ListenConfig.Admit's errors are.
func (q *QuickHello) Refusal(err error) []byte {
	var re *RefusedError
	if !errors.As(err, &re) {
		re = refuse(CodeRejected, "%v", err)
	}
	var w frameRecorder
	sendRefusal(&w, re)
	return w.out
}

// QuickHello answers, from b alone, a hello that needs nothing but the
// policy's checks: b holds the magic and a whole hello frame, the
// listener has no key and is no member of a network, and the hello asks
// for a stream to a target, with no layer to mirror (factories only, as
// a tcp route's), no route, no lookup and no datagrams. Anything else,
// a refusal included, returns false: the caller hands the connection to
// the listener, whose handshake reads it again from the start and
// answers it. accepted is when the connection was accepted, remote where
// it came from.
//
// The caller sets the hello's congestion control (Hello.CongestionControl)
// on its socket, reaches the target before Deadline, and sends Accept or
// Refusal. Observe is not called: the caller reports the handshake, and
// logs it with Taken.
func (l *Listener) QuickHello(b []byte, remote net.Addr, accepted time.Time) (*QuickHello, bool) {
	p := &l.cfg.Policy
	if p.Key != nil || p.Member != nil || len(b) < len(magic)+headerSize || string(b[:len(magic)]) != magic {
		return nil, false
	}
	hdr := header(b[len(magic):])
	n := len(magic) + headerSize + hdr.Len()
	if hdr.Version() != protoVersion || hdr.Type() != msgHello || hdr.Len() > maxBody || len(b) < n {
		return nil, false
	}
	m, err := decodeBody(msgHello, b[len(magic)+headerSize:n])
	if err != nil || m.stack != "" || m.target == "" || m.nonce != nil || m.node != "" || m.cert != nil || m.first != nil ||
		m.lookup || m.dgram || len(m.hops) > 0 || len(m.trail) > 0 || m.origin != "" {
		return nil, false
	}
	// The same checks as the listener's own handshake, over the bytes:
	// with no key and no route, it only reads, or writes a refusal and
	// fails, which the listener's handshake then sends itself.
	c := &frameRecorder{in: b[len(magic):n], remote: remote}
	h, err := l.serverHandshake(c, nil, nil)
	if err != nil || len(c.out) > 0 || len(h.Stack.Layers) > 0 || h.ends() || h.static {
		return nil, false
	}
	q := &QuickHello{Hello: h, Len: n, Deadline: accepted.Add(l.cfg.HandshakeTimeout), log: l.log, accepted: accepted}
	if longer := l.waitLonger(h, q.Deadline); !longer.IsZero() {
		q.Deadline = longer
	}
	if err := accept(c, h); err != nil {
		return nil, false
	}
	q.Accept = c.out
	return q, true
}

// Taken logs the hello as accepted, at level Debug, as the listener's
// handshake logs the hellos it accepts. The caller calls it once it takes
// the connection; one it hands to the listener instead is logged there.
func (q *QuickHello) Taken() {
	if q.log == nil || !q.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	h := q.Hello
	q.log.Debug("vlink: accepted", "remote", h.RemoteAddr, "stack", h.Stack.String(), "target", h.Target, "node", h.Node,
		"hops", h.Hops, "forwarded", h.Forwarded, "took", time.Since(q.accepted), "quick", true)
}

// frameRecorder is the connection QuickHello runs the listener's
// handshake over: it reads the bytes given and keeps what is written.
type frameRecorder struct {
	in     []byte
	out    []byte
	remote net.Addr
}

var _ net.Conn = (*frameRecorder)(nil)

func (r *frameRecorder) Read(b []byte) (int, error) {
	if len(r.in) == 0 {
		return 0, io.ErrUnexpectedEOF // the frame was whole: never reached
	}
	n := copy(b, r.in)
	r.in = r.in[n:]
	return n, nil
}

func (r *frameRecorder) Write(b []byte) (int, error) {
	r.out = append(r.out, b...)
	return len(b), nil
}

func (r *frameRecorder) Close() error                     { return nil }
func (r *frameRecorder) LocalAddr() net.Addr              { return nil }
func (r *frameRecorder) RemoteAddr() net.Addr             { return r.remote }
func (r *frameRecorder) SetDeadline(time.Time) error      { return os.ErrNoDeadline }
func (r *frameRecorder) SetReadDeadline(time.Time) error  { return os.ErrNoDeadline }
func (r *frameRecorder) SetWriteDeadline(time.Time) error { return os.ErrNoDeadline }

// PlainHello returns what a Dialer with no key, node or certificate sends
// a gateway for a stream to target through factories alone (a tcp route
// through the gateway): the magic and its hello, naming cc, the
// congestion control of its TCP connection ("" for the system's), and
// ctx's deadline as its target wait, as the Dialer names them. It is for
// a caller that makes the gateway's connection itself (vlink exec's
// agent, on its own thread); ReadPlainAnswer reads the answer.
func PlainHello(ctx context.Context, target, cc string) []byte {
	return helloBytes(&message{target: target, cc: cc, wait: targetWait(ctx, target, false, false)}, nil)
}

// ReadPlainAnswer reads from r, no further than its end, a gateway's
// answer to hello, made by PlainHello, and checks it as a Dialer with no
// key does: nil for an accept, a *RefusedError for a refusal (one that
// asks for a key too), or why the answer is none (ErrNotVLink for a peer
// that speaks no VLink). A hello too short to be one is ErrBadHello,
// before anything is read.
func ReadPlainAnswer(r io.Reader, hello []byte) error {
	if len(hello) < len(magic)+headerSize {
		return fmt.Errorf("%w: %d bytes are no hello", ErrBadHello, len(hello))
	}
	m, body, err := readFrame(r, msgChallenge, msgAccept, msgRefuse)
	if err != nil {
		return answerError(err)
	}
	// No key: the long way never writes (a challenge is a refusal).
	_, _, err = clientLongWay(nil, &message{typ: msgHello}, m, body, hello, nil, nil)
	return err
}

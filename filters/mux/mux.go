// Package mux provides the "mux" layer of vlink: many connections share
// one established stack, as streams of a github.com/xtaci/smux session
// (protocol version 2, with a flow-control window per stream). A short
// connection then costs no round trip of its own before its first byte
// (the stream's nested hello travels with its first data; a refusal
// comes back from the first Read) instead of a TCP handshake, a hello and
// whatever the layers below set up (an SSH session, parallel substreams,
// a compression context):
//
//	vlink tunnel --stack mux+parallel:streams=4 ...
//
// It is a vlink multi-link layer. A vlink.Dialer keeps one mux layer per
// path, and the layer keeps one session open for all the dials along that
// path, re-establishing it after it drops; sessions idle for longer than
// the idle parameter are closed (so are all of them by Dialer.Close). On
// the listening side each stream goes through the listener's nested hello
// like a newly accepted connection, so the forwarding target and the
// layers above mux are chosen and checked per stream.
//
// smux's streams are wrapped to honour the whole net.Conn contract:
// deadlines wrap os.ErrDeadlineExceeded and apply to calls already
// blocked, use after Close is net.ErrClosed, CloseWrite half-closes. A
// stream never ends cleanly unless its peer closed it: one whose session
// died reports ErrSessionClosed, and one the peer aborted on its own
// (smux has no stream reset; see frame.go) reports ErrAborted. Once the
// peer has closed a stream for good (Close or Abort, after CloseWrite or
// without it), writes to it fail, as a TCP write does once the peer's
// reset answers it: with ErrAborted and syscall.EPIPE or ECONNRESET.
package mux

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/xtaci/smux"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Defaults of the layer's parameters.
const (
	DefaultWindow = 1 << 20
	DefaultBuffer = 8 << 20
	DefaultIdle   = 90 * time.Second
)

// WireVersion is the version of the layer's wire format that this build
// speaks, its "version" parameter (layer.VersionParam has the rule): 1,
// each stream's bytes as records that end with an end record (frame.go),
// over smux's protocol version 2. The format before the records had no
// version and is not spoken: a peer from before them fails each stream's
// nested hello (see docs/ARCHITECTURE.md, the mux section).
const WireVersion = 1

func init() {
	layer.Register(layer.Spec{
		Name:    "mux",
		Kind:    layer.KindMultiLink,
		Summary: "carry many connections as streams of one session over the layers below (smux)",
		Params: []layer.Param{
			{Name: "window", Type: layer.TypeSize, Default: "1M", Min: 64 << 10, Max: 16 << 20,
				Doc: "per-stream receive window: how far a stream's writer may get ahead of its reader"},
			{Name: "buffer", Type: layer.TypeSize, Default: "8M", Min: 256 << 10, Max: 64 << 20,
				Doc: "receive buffer of the whole session, shared by its streams"},
			{Name: "idle", Type: layer.TypeDuration, Default: DefaultIdle.String(), Min: int64(time.Second), Max: int64(24 * time.Hour), Local: true,
				Doc: "close a dialer's session after it has carried no stream for this long"},
			layer.Version(WireVersion, WireVersion, WireVersion),
		},
		EndMarker: true,
		New: func(a layer.Args) (any, error) {
			if _, err := a.Version(); err != nil {
				return nil, fmt.Errorf("mux: %w", err)
			}
			return New(Config{Window: int(a.Size("window")), Buffer: int(a.Size("buffer")), Idle: a.Duration("idle")})
		},
	})
}

// Config is the mux layer's configuration. Zero fields take the defaults.
type Config struct {
	Window int           // per-stream receive window; zero means DefaultWindow
	Buffer int           // session receive buffer; zero means DefaultBuffer
	Idle   time.Duration // idle session lifetime on the dialing side; zero means DefaultIdle
}

// Validate reports whether c is usable.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Window > c.Buffer {
		return fmt.Errorf("mux: %w: window %d exceeds the session buffer %d", layer.ErrBadParam, c.Window, c.Buffer)
	}
	return smux.VerifyConfig(c.smux())
}

func (c Config) withDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	if c.Idle == 0 {
		c.Idle = DefaultIdle
	}
	return c
}

func (c Config) smux() *smux.Config {
	sc := smux.DefaultConfig()
	sc.Version = 2
	sc.MaxStreamBuffer = c.Window
	sc.MaxReceiveBuffer = c.Buffer
	return sc
}

// ErrSessionClosed is matched by the errors of a stream whose session
// ended before the stream did (the connection below failed, or the peer
// went away).
var ErrSessionClosed = errors.New("mux session closed")

// Layer is the mux layer. It implements layer.MultiLink and io.Closer.
type Layer struct {
	cfg Config

	mu      sync.Mutex
	sess    *smux.Session
	dialing chan struct{} // closed when the session being dialed is ready
	closed  bool
}

var _ layer.EarlyDataLayer = (*Layer)(nil)

// EarlyData reports that a stream may carry data before its nested hello
// is answered: a short connection then costs no round trip of its own
// before its first byte. A refused stream reports the refusal from its
// first Read.
func (l *Layer) EarlyData() bool { return true }

// New returns a mux layer.
func New(cfg Config) (*Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Layer{cfg: cfg.withDefaults()}, nil
}

// Dial opens a stream on the layer's session, dialing the session through
// lower first if there is none (or it has died).
func (l *Layer) Dial(ctx context.Context, network, address string, lower layer.Lower) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		sess, fresh, err := l.session(ctx, network, address, lower)
		if err != nil {
			return nil, err
		}
		st, err := sess.OpenStream()
		if err == nil {
			return newStream(st), nil
		}
		l.drop(sess)
		if fresh || attempt > 0 {
			return nil, fmt.Errorf("mux: opening a stream: %w", err)
		}
		// The session died since its last use: dial a new one.
	}
}

// session returns the live session, dialing one if needed; fresh reports
// that this call dialed it.
func (l *Layer) session(ctx context.Context, network, address string, lower layer.Lower) (*smux.Session, bool, error) {
	for {
		l.mu.Lock()
		if l.sess != nil && !l.sess.IsClosed() {
			s := l.sess
			l.mu.Unlock()
			return s, false, nil
		}
		if l.dialing != nil {
			wait := l.dialing
			l.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		l.dialing = make(chan struct{})
		l.mu.Unlock()

		sess, err := l.dial(ctx, network, address, lower)

		l.mu.Lock()
		close(l.dialing)
		l.dialing = nil
		if err == nil && l.closed {
			sess.Close()
			err = fmt.Errorf("mux: %w", net.ErrClosed)
		}
		if err == nil {
			l.sess = sess
		}
		l.mu.Unlock()
		if err != nil {
			return nil, false, err
		}
		stats.sessions.Add(1)
		go l.reapIdle(sess)
		return sess, true, nil
	}
}

func (l *Layer) dial(ctx context.Context, network, address string, lower layer.Lower) (*smux.Session, error) {
	c, err := lower.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	sess, err := smux.Client(newSessionConn(c), l.cfg.smux())
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("mux: %w", err)
	}
	return sess, nil
}

// reapIdle closes sess once it has carried no stream for the idle time;
// it returns once sess is closed.
func (l *Layer) reapIdle(sess *smux.Session) {
	defer stats.sessionsEnded.Add(1)
	tick := time.NewTicker(l.cfg.Idle / 2)
	defer tick.Stop()
	idleSince := time.Now()
	for {
		select {
		case <-sess.CloseChan():
			l.drop(sess)
			return
		case now := <-tick.C:
			if sess.NumStreams() > 0 {
				idleSince = now
			} else if now.Sub(idleSince) >= l.cfg.Idle {
				l.drop(sess)
				return
			}
		}
	}
}

// drop closes sess and forgets it if it is the current session.
func (l *Layer) drop(sess *smux.Session) {
	l.mu.Lock()
	if l.sess == sess {
		l.sess = nil
	}
	l.mu.Unlock()
	sess.Close()
}

// Close closes the dialing side's session and every stream on it. Later
// dials fail with net.ErrClosed.
func (l *Layer) Close() error {
	l.mu.Lock()
	sess := l.sess
	l.sess, l.closed = nil, true
	l.mu.Unlock()
	if sess != nil {
		return sess.Close()
	}
	return nil
}

// Accept serves a session on c: every stream the dialer opens goes to
// j.Deliver.
func (l *Layer) Accept(c net.Conn, j layer.Junction) error {
	sess, err := smux.Server(newSessionConn(c), l.cfg.smux())
	if err != nil {
		return fmt.Errorf("mux: %w", err)
	}
	stats.sessions.Add(1)
	go serve(sess, j)
	return nil
}

// serve delivers the session's streams until it ends. Once the listener
// has closed, new streams are refused and the session closes as soon as
// it carries none.
func serve(sess *smux.Session, j layer.Junction) {
	defer stats.sessionsEnded.Add(1)
	go func() {
		select {
		case <-j.Done():
		case <-sess.CloseChan():
			return
		}
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for sess.NumStreams() > 0 {
			select {
			case <-tick.C:
			case <-sess.CloseChan():
				return
			}
		}
		sess.Close()
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			sess.Close()
			return
		}
		if j.Deliver(newStream(st)) != nil {
			// The listener is closed: Deliver closed the stream.
			continue
		}
	}
}

// sessionConn is the connection under a session. smux hands its read
// error to every stream's Read; a bare io.EOF there would make each
// stream look complete when the connection merely ended (a peer process
// killed, say), so the end of the connection becomes an error of its own.
//
// Reads go through a small buffer: smux reads each frame's 8-byte header
// and then its body with a read each, so a short stream's frames (its
// open, hello, a few bytes, its end) cost two system calls apiece, where
// the frames that arrived together now cost one read in all. A body at
// least as large as the buffer, once the buffer is empty, goes straight
// into smux's.
type sessionConn struct {
	net.Conn
	r *bufio.Reader
}

// sessionReadBuf is sessionConn's buffer: one per session, not per stream.
const sessionReadBuf = 4 << 10

func newSessionConn(c net.Conn) sessionConn {
	return sessionConn{Conn: c, r: bufio.NewReaderSize(endIsError{c}, sessionReadBuf)}
}

var errConnEOF = fmt.Errorf("connection under the session ended: %w", io.ErrUnexpectedEOF)

func (c sessionConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// endIsError reads c, its end as errConnEOF.
type endIsError struct{ c net.Conn }

func (e endIsError) Read(p []byte) (int, error) {
	n, err := e.c.Read(p)
	if err == io.EOF {
		err = errConnEOF
	}
	return n, err
}

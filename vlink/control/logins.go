package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/vlink"
)

// Reasons a relay counts failed logins by (RelayStats.FailedLogins): a
// fixed set, so that nothing from the network becomes a metric's label.
const (
	LoginAuthFailed   = "authentication_failed"   // the proof did not match the key
	LoginAuthRequired = "authentication_required" // no proof, or no node name
	LoginMalformed    = "malformed"               // a hello or first frame that does not parse
	LoginRefused      = "refused"                 // a hello the relay's policy refused otherwise
	LoginPlaintext    = "not_encrypted"           // no VLink hello, or a control connection without noise
	LoginFailed       = "handshake_failed"        // cut, timed out or shed mid-handshake
)

var loginReasons = [...]string{LoginAuthFailed, LoginAuthRequired, LoginMalformed, LoginRefused, LoginPlaintext, LoginFailed}

// Refusal log lines are rate-limited, so that a scan or a password
// guesser costs the relay's log at most refusalLogBurst lines per
// refusalLogEvery; the lines left out are counted in the next one.
const (
	refusalLogBurst = 10
	refusalLogEvery = time.Second
)

// logins counts and logs a relay's failed logins.
type logins struct {
	counts [len(loginReasons)]atomic.Uint64
	log    *slog.Logger // rate-limited

	mu         sync.Mutex
	window     time.Time // start of the current rate window
	inWindow   int       // lines logged in it
	suppressed int       // lines left out since the last one logged
}

// failed counts one failed login for reason (one of loginReasons).
func (l *logins) failed(reason string) {
	for i, r := range loginReasons {
		if r == reason {
			l.counts[i].Add(1)
			return
		}
	}
}

func (l *logins) snapshot() map[string]uint64 {
	m := make(map[string]uint64, len(loginReasons))
	for i, r := range loginReasons {
		m[r] = l.counts[i].Load()
	}
	return m
}

// allow reports whether a line may be logged now, and how many were
// left out before it.
func (l *logins) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.window) >= refusalLogEvery {
		l.window, l.inWindow = now, 0
	}
	if l.inWindow >= refusalLogBurst {
		l.suppressed++
		return 0, false
	}
	l.inWindow++
	suppressed, l.suppressed = l.suppressed, 0
	return suppressed, true
}

// limitedHandler passes Info and above through logins.allow, and the
// rest (the listener's per-connection Debug lines) as they come.
type limitedHandler struct {
	slog.Handler
	l *logins
}

func (h limitedHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelInfo {
		n, ok := h.l.allow(time.Now())
		if !ok {
			return nil
		}
		if n > 0 {
			rec = rec.Clone()
			rec.AddAttrs(slog.Int("suppressed", n))
		}
	}
	return h.Handler.Handle(ctx, rec)
}

func (h limitedHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return limitedHandler{h.Handler.WithAttrs(as), h.l}
}

func (h limitedHandler) WithGroup(name string) slog.Handler {
	return limitedHandler{h.Handler.WithGroup(name), h.l}
}

// observe counts a failed handshake of the relay's listener (see
// vlink.ListenConfig.Observe), which logs it through l.log.
func (l *logins) observe(_ *vlink.Conn, _ time.Duration, err error) {
	if err == nil {
		return
	}
	var re *vlink.RefusedError
	switch {
	case errors.As(err, &re) && re.Code == vlink.CodeAuthFailed:
		l.failed(LoginAuthFailed)
	case errors.As(err, &re) && re.Code == vlink.CodeAuthRequired:
		l.failed(LoginAuthRequired)
	case errors.As(err, &re) && (re.Code == vlink.CodeMalformed || re.Code == vlink.CodeVersion):
		l.failed(LoginMalformed)
	case errors.As(err, &re):
		l.failed(LoginRefused)
	case errors.Is(err, vlink.ErrPlainRefused):
		l.failed(LoginPlaintext)
	default:
		l.failed(LoginFailed)
	}
}

// Listen returns a listener for r.Serve on address: a vlink.Listener
// whose policy holds the network key, from which each node's key is
// derived (vlink.NodeKey), and which refuses plain connections. Its
// refusals reach r's logger, rate-limited, and r's Stats.
//
// A relay with a certificate (RelayConfig.Member) takes no network key:
// networkKey must be nil.
func (r *Relay) Listen(ctx context.Context, address string, networkKey []byte) (*vlink.Listener, error) {
	lc, err := r.listenConfig(networkKey)
	if err != nil {
		return nil, err
	}
	return lc.Listen(ctx, "tcp", address)
}

// NewListener is Listen over a listener of the caller's: one an SSH
// server forwards to us, say.
func (r *Relay) NewListener(l net.Listener, networkKey []byte) (*vlink.Listener, error) {
	lc, err := r.listenConfig(networkKey)
	if err != nil {
		return nil, err
	}
	return lc.NewListener(l)
}

func (r *Relay) listenConfig(networkKey []byte) (*vlink.ListenConfig, error) {
	switch {
	case r.cfg.Member != nil && networkKey != nil:
		return nil, errors.New("control: relay: a relay with a certificate takes no network key: nodes prove their names with certificates (a network is in one mode)")
	case r.cfg.Member == nil && networkKey == nil:
		return nil, errors.New("control: relay: no network key and no certificate: nodes would have nothing to prove their names with")
	}
	return &vlink.ListenConfig{
		Policy: vlink.Policy{
			Key:    networkKey,
			Member: r.cfg.Member,
			Layers: []string{vlink.EncryptionLayer, "identity"},
			Plain:  vlink.PlainRefuse,
			// The ends of relayed connections carry what the nodes
			// encrypt end to end; control connections must hold the
			// encryption layer, which Serve checks.
			InsecurePlaintext: true,
		},
		Logger:  r.logins.log,
		Observe: r.logins.observe,
	}, nil
}

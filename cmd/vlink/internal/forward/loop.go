package forward

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/netconn/evloop"
)

// LoopHandler follows the connections of an event loop (package evloop)
// as Relay follows a goroutine's: shutdown waits for them (CutLoop cuts
// them after the grace), they count in the metrics under l and in
// --stats, and they are logged as Relay logs, naming listen and to.
func (t *Tracker) LoopHandler(log *slog.Logger, l metrics.Labels, listen, to string) evloop.Handler {
	return &loopHandler{t: t, log: log, labels: l, listen: listen, to: to}
}

// CutLoop aborts lp's connections when the Tracker cuts its connections;
// the returned func stops that.
func (t *Tracker) CutLoop(lp *evloop.Loop) (stop func() bool) {
	return context.AfterFunc(t.Ctx, lp.Abort)
}

type loopHandler struct {
	t          *Tracker
	log        *slog.Logger
	labels     metrics.Labels
	listen, to string
}

// A LoopGreeting is what an event loop's Greeter knows of a connection
// it took, left in its evloop.Conn's Value for the LoopHandler: the
// stack label of its metrics and the attributes of its logs, in place of
// the handler's.
type LoopGreeting struct {
	Stack string
	Attrs []any
	// Value is the Greeter's.
	Value any
}

// GreetingOf returns the LoopGreeting a Greeter left in c, once the
// LoopHandler took c: nil if there was none.
func GreetingOf(c *evloop.Conn) *LoopGreeting {
	switch v := c.Value.(type) {
	case *loopConn:
		return v.greeting
	case *LoopGreeting:
		return v
	}
	return nil
}

// loopConn is a connection's state in the handler.
type loopConn struct {
	greeting *LoopGreeting
	labels   metrics.Labels
	attrs    []any
	live     *liveRelay
}

func (h *loopHandler) Accepted(c *evloop.Conn) bool {
	if !h.t.hold() {
		return false
	}
	lc := &loopConn{labels: h.labels}
	if g, ok := c.Value.(*LoopGreeting); ok {
		lc.greeting, lc.labels.Stack, lc.attrs = g, g.Stack, g.Attrs
	} else {
		lc.attrs = []any{"remote", c.Remote.String(), "listen", h.listen, "to", h.to}
	}
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		h.log.Debug("connection", lc.attrs...)
	}
	c.Value = lc
	return true
}

func (h *loopHandler) Dialed(c *evloop.Conn, took time.Duration, err error) {
	lc := c.Value.(*loopConn)
	l := lc.labels
	if err == nil {
		l.Transport = metrics.TransportTCP
	}
	h.t.Metrics.Dialed(l, took, err)
	if err != nil {
		switch {
		case c.Aborted:
		case lc.greeting == nil:
			h.log.Info("cannot reach destination", append(lc.attrs, "err", err)...)
		case errors.Is(err, evloop.ErrClientLeft):
			h.log.Info("the dialer left before the target answered", lc.attrs...)
		} // else the Greeter's refusal said why
		h.t.wg.Done()
		return
	}
	h.t.Metrics.RelayStarted(l)
	live := &liveRelay{labels: l, start: time.Now(), attrs: lc.attrs, carried: c.Carried}
	lc.live = live
	h.t.liveStart(live)
}

func (h *loopHandler) Ended(c *evloop.Conn, err error) {
	defer h.t.wg.Done()
	live := c.Value.(*loopConn).live
	h.t.mu.Lock()
	cut := h.t.cut
	h.t.mu.Unlock()
	h.t.liveEnd(live, c.Up, c.Down, cut || err != nil)
	h.t.Metrics.RelayEnded(live.labels, outcome(cut, err))
	// As Tracker.RelayIdle logs: only failures above debug.
	level, msg := slog.LevelDebug, "connection closed"
	switch {
	case cut:
		msg = "connection cut at shutdown"
	case err != nil:
		level, msg = slog.LevelInfo, "connection failed"
	}
	if !h.log.Enabled(context.Background(), level) {
		return
	}
	attrs := append(live.attrs, "bytes_up", c.Up, "bytes_down", c.Down, "took", time.Since(live.start).Round(time.Millisecond))
	if err != nil && !cut {
		attrs = append(attrs, "err", err)
	}
	h.log.Log(context.Background(), level, msg, attrs...)
}

func outcome(cut bool, err error) string {
	switch {
	case cut:
		return metrics.OutcomeCut
	case err != nil:
		return metrics.OutcomeFailed
	}
	return metrics.OutcomeOK
}

// hold counts a connection shutdown waits for, unless shutdown has
// begun.
func (t *Tracker) hold() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopping {
		return false
	}
	t.wg.Add(1)
	return true
}

package forward

import (
	"context"
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

// loopConn is a connection's state in the handler.
type loopConn struct {
	live *liveRelay
}

func (h *loopHandler) attrs(c *evloop.Conn) []any {
	return []any{"remote", c.Remote.String(), "listen", h.listen, "to", h.to}
}

func (h *loopHandler) Accepted(c *evloop.Conn) bool {
	if !h.t.hold() {
		return false
	}
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		h.log.Debug("connection", h.attrs(c)...)
	}
	c.Value = &loopConn{}
	return true
}

func (h *loopHandler) Dialed(c *evloop.Conn, took time.Duration, err error) {
	l := h.labels
	if err == nil {
		l.Transport = metrics.TransportTCP
	}
	h.t.Metrics.Dialed(l, took, err)
	if err != nil {
		if !c.Aborted {
			h.log.Info("cannot reach destination", append(h.attrs(c), "err", err)...)
		}
		h.t.wg.Done()
		return
	}
	h.t.Metrics.RelayStarted(l)
	live := &liveRelay{labels: l, start: time.Now(), attrs: h.attrs(c), carried: c.Carried}
	c.Value.(*loopConn).live = live
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

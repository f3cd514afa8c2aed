package vlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
)

// Best-effort routes: a config route that lists several ways to reach its
// destinations (try = ["direct", "ssh:host=bastion", ...]) races them, as
// Happy Eyeballs (RFC 8305) races addresses: the first way starts at once,
// each next one RaceStagger later or as soon as every way started so far
// has failed; the first to connect wins, and the others are cancelled, or
// closed if they connected too. A Dialer remembers, per destination, the
// way that won (tried first for winnerTTL) and the ways that failed (tried
// last for failureTTL), so a dead way costs a dial nothing while another
// works, and is still tried when none does.
//
// Environment variables narrow the ways of every best-effort route, as
// pscom's PSP_* variables do its paths: EnvPathsOnly keeps only the ways
// it names, in the route's order; EnvPathsExclude drops those it names. A
// name is "direct", a layer's name (ssh, socks5, zstd) matching every way
// whose stack holds that layer, or a way's whole text. They narrow the
// paths to a node too (PathNodeDialer: reverse, splice, relay).

// RaceStagger is how long a best-effort dial gives a way before it starts
// the next (RFC 8305's Connection Attempt Delay).
const RaceStagger = 250 * time.Millisecond

// Environment variables read by [ConfigFromEnv] for best-effort routes.
const (
	// EnvPathsOnly keeps only the ways it names (comma-separated).
	EnvPathsOnly = "VLINK_PATHS_ONLY"
	// EnvPathsExclude drops the ways it names (comma-separated).
	EnvPathsExclude = "VLINK_PATHS_EXCLUDE"
)

// What a Dialer remembers of best-effort dials.
const (
	winnerTTL     = 10 * time.Minute
	failureTTL    = 30 * time.Second
	maxRemembered = 4096 // destinations; beyond, the memory starts over
)

// ErrNoWay is matched by the error of a best-effort dial whose every way
// is excluded (EnvPathsOnly, EnvPathsExclude).
var ErrNoWay = errors.New("vlink: every way to the destination is excluded")

// An Attempt is one way a dial tried, or skipped.
type Attempt struct {
	// Way is "direct" or the stack's text form.
	Way string
	// Start is when the attempt started, after the dial began; Took how
	// long it ran until it connected, failed or was stopped.
	Start, Took time.Duration
	// Err is why it failed; nil for the winner, and for an attempt
	// stopped because another won (Stopped) or never started.
	Err error
	// Won: the dial returned this way's connection. Stopped: another way
	// won first. Started: the attempt ran at all.
	Won, Stopped, Started bool
	// Note says why the way came where it did in the order: "won last
	// time", "failed 3s ago".
	Note string
}

// A RouteReport says how a dial chose its way: the route it matched and
// every attempt, in the order they were started.
type RouteReport struct {
	Address string
	// Rule is the config route that matched, in its text form.
	Rule     string
	Attempts []Attempt
	// Way is the way taken, "" if none connected.
	Way string
	// Path is how a connection to a node came (reverse, splice, relay),
	// when the network says.
	Path string
}

// A RaceError is the error of a best-effort dial that no way completed.
// Unwrap gives every attempt's error.
type RaceError struct {
	Address  string
	Attempts []Attempt
}

func (e *RaceError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no way reached %s:", e.Address)
	for _, a := range e.Attempts {
		if a.Started {
			fmt.Fprintf(&b, " [%s: %v]", a.Way, a.Err)
		}
	}
	return b.String()
}

func (e *RaceError) Unwrap() []error {
	var errs []error
	for _, a := range e.Attempts {
		if a.Err != nil {
			errs = append(errs, a.Err)
		}
	}
	return errs
}

// PathOf says how connection c was made, when it knows: the way a
// best-effort dial took ("direct", a stack), or for a connection to a
// node the network's path (reverse, splice, relay). "" if c does not say.
func PathOf(c net.Conn) string {
	for c != nil {
		if p, ok := c.(interface{ Path() string }); ok {
			return p.Path()
		}
		u, ok := c.(netconn.Unwrapper)
		if !ok {
			return ""
		}
		c = u.UnwrapConn()
	}
	return ""
}

// routedConn is a connection from a best-effort dial, which knows the way
// it took. Every method goes to the connection, the fast paths included.
type routedConn struct {
	net.Conn
	way string
}

var (
	_ net.Conn          = (*routedConn)(nil)
	_ io.ReaderFrom     = (*routedConn)(nil)
	_ io.WriterTo       = (*routedConn)(nil)
	_ netconn.Unwrapper = (*routedConn)(nil)
)

// Path returns the way the dial took.
func (c *routedConn) Path() string         { return c.way }
func (c *routedConn) UnwrapConn() net.Conn { return c.Conn }
func (c *routedConn) CloseWrite() error    { return netconn.CloseWrite(c.Conn) }

func (c *routedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(c.Conn, r)
}

func (c *routedConn) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := c.Conn.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, c.Conn)
}

// way is one way of a best-effort route.
type way struct {
	name  string // selector.TryDirect or the stack's text
	stack Stack  // zero for direct
}

// ways narrows a route's ways by the config's EnvPathsOnly and
// EnvPathsExclude.
func (c *Config) ways(try []string) []way {
	var out []way
	for _, name := range try {
		w := way{name: name}
		if name != selector.TryDirect {
			w.stack = c.stacks[name]
		}
		if len(c.only) > 0 && !w.matches(c.only) || w.matches(c.exclude) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// matches reports whether one of names names w.
func (w way) matches(names []string) bool {
	for _, n := range names {
		if n == w.name {
			return true
		}
		for _, l := range w.stack.Layers {
			if l.Name == n {
				return true
			}
		}
	}
	return false
}

// pathNames parses a comma-separated list of way names.
func pathNames(v string) []string {
	var out []string
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// pathsFromEnv reads EnvPathsOnly and EnvPathsExclude into c.
func (c *Config) pathsFromEnv() {
	c.only = pathNames(os.Getenv(EnvPathsOnly))
	c.exclude = pathNames(os.Getenv(EnvPathsExclude))
}

// memory is what a Dialer remembers of best-effort dials, per destination.
type memory struct {
	mu    sync.Mutex
	dests map[string]*recall
}

type recall struct {
	winner      string
	winnerUntil time.Time
	failed      map[string]time.Time // way -> until
}

// order returns ws in the order to try them: the last winner first, the
// ways that failed lately last, the rest in the route's order; and a note
// for each way (by its place in the result) that moved. In the common
// case, where the winner is the first way already and nothing failed, it
// returns ws itself.
func (m *memory) order(address string, ws []way) ([]way, []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.dests[address]
	if r == nil {
		return ws, nil
	}
	now := time.Now()
	winner := r.winner
	if now.After(r.winnerUntil) {
		winner = ""
	}
	if len(r.failed) == 0 && (winner == "" || winner == ws[0].name) {
		if winner == "" {
			return ws, nil
		}
		return ws, []string{"won last time"}
	}
	var rank [selector.MaxTry]int
	var note [selector.MaxTry]string
	for i, w := range ws {
		switch {
		case w.name == winner:
			rank[i], note[i] = 0, "won last time"
		case now.Before(r.failed[w.name]):
			note[i] = "failed just now"
			if ago := (failureTTL - r.failed[w.name].Sub(now)).Round(time.Second); ago > 0 {
				note[i] = fmt.Sprintf("failed %v ago", ago)
			}
			rank[i] = 2
		default:
			rank[i] = 1
		}
	}
	idx := make([]int, len(ws))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return rank[a] - rank[b] })
	out, notes := make([]way, len(ws)), make([]string, len(ws))
	for k, i := range idx {
		out[k], notes[k] = ws[i], note[i]
	}
	return out, notes
}

// remember records a dial's outcome.
func (m *memory) remember(address string, attempts []Attempt) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dests == nil || len(m.dests) >= maxRemembered {
		m.dests = map[string]*recall{}
	}
	r := m.dests[address]
	if r == nil {
		r = &recall{failed: map[string]time.Time{}}
		m.dests[address] = r
	}
	now := time.Now()
	if len(attempts) > 0 && attempts[0].Won && r.winner == attempts[0].Way && len(r.failed) == 0 && r.winnerUntil.Sub(now) > winnerTTL/2 {
		return // the usual: the winner won again, nothing to note
	}
	for _, a := range attempts {
		switch {
		case a.Won:
			r.winner, r.winnerUntil = a.Way, now.Add(winnerTTL)
			delete(r.failed, a.Way)
		case a.Err != nil:
			r.failed[a.Way] = now.Add(failureTTL)
			if r.winner == a.Way {
				r.winner = ""
			}
		}
	}
}

// race dials address by the ways of best-effort route r.
//
// The first way is dialed on the caller's goroutine, whose stack has
// grown already: a dial whose first way connects within the stagger (the
// common case, once the winner is remembered) starts no goroutine, and
// pays a timer and a context. Each other way gets a goroutine of its own.
// Whoever finishes first, under the racer's lock, wins and cancels the
// others, the caller's dial included.
func (d *Dialer) race(ctx context.Context, network, address string, r *route, rep *RouteReport) (net.Conn, error) {
	if len(r.ways) == 0 {
		return nil, fmt.Errorf("%w (%s, %s)", ErrNoWay, EnvPathsOnly, EnvPathsExclude)
	}
	ws, notes := d.memory.order(address, r.ways)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	x := &racer{d: d, ctx: ctx, cancel: cancel, network: network, address: address, r: r, ws: ws, begin: time.Now()}
	x.attempts = x.room[:len(ws)]
	for i, w := range ws {
		x.attempts[i].Way = w.name
		if i < len(notes) {
			x.attempts[i].Note = notes[i]
		}
	}
	x.attempts[0].Started = true
	x.next, x.running = 1, 1
	x.wg.Add(1)
	if len(ws) > 1 {
		x.mu.Lock() // tick reads x.timer
		x.timer = time.AfterFunc(RaceStagger, x.tick)
		x.mu.Unlock()
	}
	c, err := d.dialWay(ctx, network, address, r, ws[0])
	x.finish(0, c, err)
	x.wg.Wait()
	if x.timer != nil {
		x.timer.Stop()
	}
	// Failures count only where the dial did not end them: a caller that
	// gave up says nothing about the ways. (A way's handshake maps the
	// deadline onto its connection, whose timer may fire before the
	// context's: the deadline itself is what tells.)
	dl, hasDeadline := ctx.Deadline()
	gaveUp := ctx.Err() != nil || hasDeadline && !time.Now().Before(dl)
	if x.won != nil || !gaveUp {
		d.memory.remember(address, x.attempts)
	}
	if rep != nil {
		rep.Attempts = x.attempts
	}
	if x.won == nil {
		return nil, &RaceError{Address: address, Attempts: x.attempts}
	}
	w := ws[x.wonAt].name
	if rep != nil {
		rep.Way, rep.Path = w, PathOf(x.won)
	}
	return &routedConn{Conn: x.won, way: w}, nil
}

// A racer is one best-effort dial's race.
type racer struct {
	d             *Dialer
	ctx           context.Context
	cancel        context.CancelFunc
	network       string
	address       string
	r             *route
	ws            []way
	begin         time.Time
	timer         *time.Timer
	wg            sync.WaitGroup // the ways running
	mu            sync.Mutex
	attempts      []Attempt // in room
	room          [selector.MaxTry]Attempt
	next, running int      // the next way to start; the ways running
	won           net.Conn // the winner's connection
	wonAt         int
}

// start starts the next way, if the race goes on, in a goroutine of its
// own, and sets the stagger for the one after it. Called with x.mu held.
func (x *racer) start() {
	if x.won != nil || x.next >= len(x.ws) || x.ctx.Err() != nil {
		return
	}
	i := x.next
	x.next++
	x.running++
	x.attempts[i].Started = true
	x.attempts[i].Start = time.Since(x.begin)
	x.wg.Add(1) // a way is running: the count is not zero
	go func() {
		c, err := x.d.dialWay(x.ctx, x.network, x.address, x.r, x.ws[i])
		x.finish(i, c, err)
	}()
	x.timer.Reset(RaceStagger)
}

// tick is the stagger: the next way starts, though none failed.
func (x *racer) tick() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.running > 0 {
		x.start()
	}
}

// finish records way i's outcome: the first connection wins and stops the
// others; a failure starts the next way at once.
func (x *racer) finish(i int, c net.Conn, err error) {
	defer x.wg.Done()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.running--
	a := &x.attempts[i]
	a.Took = time.Since(x.begin) - a.Start
	switch {
	case err != nil && x.won != nil:
		a.Stopped = true
	case err != nil:
		a.Err = err
		if x.timer != nil {
			x.start() // no need to wait for the stagger
		}
	case x.won == nil:
		x.won, x.wonAt, a.Won = c, i, true
		x.cancel() // the others stop
	default:
		a.Stopped = true
		c.Close() // connected too, but late
	}
}

// dialWay dials address one way of best-effort route r.
func (d *Dialer) dialWay(ctx context.Context, network, address string, r *route, w way) (net.Conn, error) {
	wr := &route{stack: w.stack, key: r.key, node: r.node, peerKey: r.peerKey}
	if err := wr.checkNode(); err != nil {
		return nil, err
	}
	if !d.InsecurePlaintext {
		var err error
		if wr, err = wr.encrypted(address); err != nil {
			return nil, err
		}
	}
	return wr.dial(ctx, network, address, &d.cache)
}

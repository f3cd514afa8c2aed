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
// whose stack holds that layer, or a way's whole text.

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
// for each that moved.
func (m *memory) order(address string, ws []way) ([]way, map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.dests[address]
	if r == nil {
		return ws, nil
	}
	now := time.Now()
	notes := map[string]string{}
	rank := map[string]int{}
	for _, w := range ws {
		switch {
		case w.name == r.winner && now.Before(r.winnerUntil):
			notes[w.name], rank[w.name] = "won last time", 0
		case now.Before(r.failed[w.name]):
			note := "failed just now"
			if ago := (failureTTL - r.failed[w.name].Sub(now)).Round(time.Second); ago > 0 {
				note = fmt.Sprintf("failed %v ago", ago)
			}
			notes[w.name], rank[w.name] = note, 2
		default:
			rank[w.name] = 1
		}
	}
	out := slices.Clone(ws)
	slices.SortStableFunc(out, func(a, b way) int { return rank[a.name] - rank[b.name] })
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
func (d *Dialer) race(ctx context.Context, network, address string, r *route, rep *RouteReport) (net.Conn, error) {
	if len(r.ways) == 0 {
		return nil, fmt.Errorf("%w (%s, %s)", ErrNoWay, EnvPathsOnly, EnvPathsExclude)
	}
	ws, notes := d.memory.order(address, r.ways)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i int
		c net.Conn
		e error
	}
	results := make(chan result, len(ws))
	attempts := make([]Attempt, len(ws))
	begin := time.Now()
	start := func(i int) {
		w := ws[i]
		attempts[i].Started = true
		attempts[i].Start = time.Since(begin)
		go func() {
			c, err := d.dialWay(ctx, network, address, r, w)
			results <- result{i, c, err}
		}()
	}
	for i, w := range ws {
		attempts[i] = Attempt{Way: w.name, Note: notes[w.name]}
	}
	start(0)
	next, running := 1, 1
	stagger := time.NewTimer(RaceStagger)
	defer stagger.Stop()
	startNext := func() {
		if next < len(ws) && ctx.Err() == nil {
			start(next)
			next, running = next+1, running+1
			stagger.Reset(RaceStagger)
		}
	}
	var won *result
	for running > 0 {
		select {
		case res := <-results:
			running--
			a := &attempts[res.i]
			a.Took = time.Since(begin) - a.Start
			switch {
			case res.e != nil && won != nil:
				a.Stopped = true
			case res.e != nil:
				a.Err = res.e
				startNext() // no need to wait for the stagger
			case won == nil:
				won, a.Won = &res, true
				cancel() // the others stop
			default:
				a.Stopped = true
				res.c.Close() // connected too, but late
			}
		case <-stagger.C:
			if won == nil {
				startNext()
			}
		}
	}
	// Failures count only where the dial did not end them: a caller that
	// gave up says nothing about the ways. (A way's handshake maps the
	// deadline onto its connection, whose timer may fire before the
	// context's: the deadline itself is what tells.)
	dl, hasDeadline := ctx.Deadline()
	gaveUp := ctx.Err() != nil || hasDeadline && !time.Now().Before(dl)
	if won != nil || !gaveUp {
		d.memory.remember(address, attempts)
	}
	if rep != nil {
		rep.Attempts = attempts
	}
	if won == nil {
		return nil, &RaceError{Address: address, Attempts: attempts}
	}
	w := ws[won.i].name
	if p := PathOf(won.c); p != "" && rep != nil {
		rep.Path = p
	}
	if rep != nil {
		rep.Way = w
	}
	return &routedConn{Conn: won.c, way: w}, nil
}

// dialWay dials address one way of best-effort route r.
func (d *Dialer) dialWay(ctx context.Context, network, address string, r *route, w way) (net.Conn, error) {
	wr := &route{stack: w.stack, key: r.key, node: r.node}
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

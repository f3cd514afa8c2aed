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
// each next one raceStagger later or as soon as every way started so far
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

// raceStagger is how long a best-effort dial gives a way before it starts
// the next (RFC 8305's Connection Attempt Delay).
const raceStagger = 250 * time.Millisecond

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
	// Way is "direct" or the stack's text form, redacted
	// (secret.RedactStack).
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
	// Rule is the config route that matched, in its text form,
	// redacted.
	Rule     string
	Attempts []Attempt
	// Way is the way taken, as Attempt.Way shows it; "" if none
	// connected.
	Way string
	// Path is how a connection to a node came (reverse, splice, relay),
	// when the network says.
	Path string
	// Ladder is what the dial to a node saw of each of its paths, when
	// the network says (control.Conn.Ladder).
	Ladder []PathStep
}

// A PathStep is what a dial to a node saw of one of the paths the
// network races to it (package vlink/control: reverse, splice, relay).
type PathStep struct {
	Path string // in the order the node tries them
	// Offered: the dial let the node try it. Note says why not, or what
	// came of it.
	Offered bool
	Won     bool
	// At is when, from the dial's start, the path's connection was taken
	// (Won), or the node's step for it came (the splice's punch, the
	// relay's ready); zero for none.
	At   time.Duration
	Note string
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
// best-effort dial took ("direct", a stack, redacted), or for a connection to a
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
	shown string // name as reports, errors and logs show it: redacted
	stack Stack  // zero for direct
}

// ways narrows a route's ways by the config's EnvPathsOnly and
// EnvPathsExclude.
func (c *Config) ways(try []string) []way {
	out := make([]way, 0, len(try))
	for _, name := range try {
		w := way{name: name, shown: name}
		if name != selector.TryDirect {
			w.stack, w.shown = c.stacks[name], c.shown[name]
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
		return ws, wonLastTime
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

// wonLastTime is order's notes in the common case: read only, shared.
var wonLastTime = []string{"won last time"}

// remember records a dial's outcome: attempts[i] is ws[i]'s.
func (m *memory) remember(address string, ws []way, attempts []Attempt) {
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
	if len(attempts) > 0 && attempts[0].Won && r.winner == ws[0].name && len(r.failed) == 0 && r.winnerUntil.Sub(now) > winnerTTL/2 {
		return // the usual: the winner won again, nothing to note
	}
	for i, a := range attempts {
		switch name := ws[i].name; {
		case a.Won:
			r.winner, r.winnerUntil = name, now.Add(winnerTTL)
			delete(r.failed, name)
		case a.Err != nil:
			r.failed[name] = now.Add(failureTTL)
			if r.winner == name {
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
// pays a place on the stagger clock and a cancellable context (which
// costs a connect more than the rest of the race: see
// BenchmarkBestEffortDial). Each other way gets a goroutine of its own.
// Whoever finishes first, under the racer's lock, wins and cancels the
// others, the caller's dial included. A route left with one way races
// nothing, and cancels nothing.
func (d *Dialer) race(ctx context.Context, network, address string, r *route, rep *RouteReport) (net.Conn, error) {
	if len(r.ways) == 0 {
		return nil, fmt.Errorf("%w (%s, %s)", ErrNoWay, EnvPathsOnly, EnvPathsExclude)
	}
	ws, notes := d.memory.order(address, r.ways)
	wayCtx, cancel := ctx, context.CancelFunc(func() {})
	if len(ws) > 1 {
		wayCtx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	x := &racer{d: d, ctx: wayCtx, cancel: cancel, network: network, address: address, r: r, ws: ws, begin: time.Now()}
	x.attempts = x.room[:len(ws)]
	for i, w := range ws {
		x.attempts[i].Way = w.shown
		if i < len(notes) {
			x.attempts[i].Note = notes[i]
		}
	}
	x.attempts[0].Started = true
	x.nextWay, x.running = 1, 1
	x.wg.Add(1)
	if len(ws) > 1 {
		stagger.wait(x)
	}
	c, err := d.dialWay(wayCtx, network, address, r, ws[0])
	x.finish(0, c, err)
	x.wg.Wait()
	stagger.forget(x)
	// Failures count only where the dial did not end them: a caller that
	// gave up says nothing about the ways. (A way's handshake maps the
	// deadline onto its connection, whose timer may fire before the
	// context's: the deadline itself is what tells.)
	dl, hasDeadline := ctx.Deadline()
	gaveUp := ctx.Err() != nil || hasDeadline && !time.Now().Before(dl)
	if x.won != nil || !gaveUp {
		d.memory.remember(address, ws, x.attempts)
	}
	if rep != nil {
		rep.Attempts = x.attempts
	}
	if x.won == nil {
		return nil, &RaceError{Address: address, Attempts: x.attempts}
	}
	w := ws[x.wonAt].shown
	if rep != nil {
		rep.Way, rep.Path = w, PathOf(x.won)
	}
	return &routedConn{Conn: x.won, way: w}, nil
}

// A racer is one best-effort dial's race.
type racer struct {
	d        *Dialer
	ctx      context.Context
	cancel   context.CancelFunc
	network  string
	address  string
	r        *route
	ws       []way
	begin    time.Time
	wg       sync.WaitGroup // the ways running
	mu       sync.Mutex
	attempts []Attempt // in room
	room     [selector.MaxTry]Attempt
	nextWay  int      // the next way to start
	running  int      // the ways running
	won      net.Conn // the winner's connection
	wonAt    int
	// On the stagger clock's list, under its lock: when the way started
	// last has had its raceStagger, and the racers due before and after.
	due        time.Time
	prev, next *racer
	waiting    bool
	waits      uint64 // how many times it began to wait; also under mu
}

// start starts the next way, if the race goes on, in a goroutine of its
// own, and sets the stagger for the one after it. Called with x.mu held.
func (x *racer) start() {
	if x.won != nil || x.nextWay >= len(x.ws) || x.ctx.Err() != nil {
		return
	}
	i := x.nextWay
	x.nextWay++
	x.running++
	x.attempts[i].Started = true
	x.attempts[i].Start = time.Since(x.begin)
	x.wg.Add(1) // a way is running: the count is not zero
	go func() {
		c, err := x.d.dialWay(x.ctx, x.network, x.address, x.r, x.ws[i])
		x.finish(i, c, err)
	}()
	if x.nextWay < len(x.ws) {
		stagger.wait(x)
	}
}

// tick is the stagger: the next way starts, though none failed. wait is
// the wait it ends: a way that failed meanwhile started the next, and
// began a new wait.
func (x *racer) tick(wait uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.running > 0 && x.waits == wait {
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
		x.start() // no need to wait for the stagger
	case x.won == nil:
		x.won, x.wonAt, a.Won = c, i, true
		x.cancel() // the others stop
	default:
		a.Stopped = true
		c.Close() // connected too, but late
	}
}

// stagger is the clock of every race's stagger. One timer serves them
// all: a timer per dial, armed while the runtime's network poller sleeps
// without one, woke the poller on every dial (best effort went from
// 1.16x to 1.14x a loopback net.Dial without it, BENCHMARKS §8).
// Back-to-back dials now arm it about once per raceStagger.
var stagger staggerClock

// A staggerClock ticks racers once their current way has had its
// raceStagger. Every wait is raceStagger long, so the racers waiting, in
// the order they began to wait, are in the order they are due: the list
// is a queue whose head is due first, and the timer is armed for it.
type staggerClock struct {
	mu         sync.Mutex
	timer      *time.Timer
	armed      bool // the timer will fire
	head, tail *racer
}

// wait (re)starts x's stagger: x ticks raceStagger from now, unless it
// is forgotten first. Called with x.mu held, or before x runs.
func (k *staggerClock) wait(x *racer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unlink(x)
	x.due, x.waiting = time.Now().Add(raceStagger), true
	x.waits++
	x.prev = k.tail
	if k.tail != nil {
		k.tail.next = x
	} else {
		k.head = x
	}
	k.tail = x
	switch {
	case k.armed: // for a racer due before x
	case k.timer == nil:
		k.timer, k.armed = time.AfterFunc(raceStagger, k.fire), true
	default:
		k.timer.Reset(raceStagger)
		k.armed = true
	}
}

// forget takes x off the clock. The timer stays armed, if it was: the
// tick finds nothing due, or the next racer's due time.
func (k *staggerClock) forget(x *racer) {
	k.mu.Lock()
	k.unlink(x)
	k.mu.Unlock()
}

func (k *staggerClock) unlink(x *racer) {
	if !x.waiting {
		return
	}
	if x.prev != nil {
		x.prev.next = x.next
	} else {
		k.head = x.next
	}
	if x.next != nil {
		x.next.prev = x.prev
	} else {
		k.tail = x.prev
	}
	x.prev, x.next, x.waiting = nil, nil, false
}

// fire ticks the racers due, outside the clock's lock (a tick starts a
// way, and waits again), and arms the timer for the next one.
func (k *staggerClock) fire() {
	k.mu.Lock()
	now := time.Now()
	type tick struct {
		x    *racer
		wait uint64
	}
	var due []tick
	for x := k.head; x != nil && !x.due.After(now); x = k.head {
		k.unlink(x)
		due = append(due, tick{x, x.waits})
	}
	k.armed = k.head != nil
	if k.armed {
		k.timer.Reset(k.head.due.Sub(now))
	}
	k.mu.Unlock()
	for _, t := range due {
		t.x.tick(t.wait)
	}
}

// dialWay dials address one way of best-effort route r.
func (d *Dialer) dialWay(ctx context.Context, network, address string, r *route, w way) (net.Conn, error) {
	wr := &route{stack: w.stack, key: r.key, node: r.node, member: r.member, peerCert: r.peerCert, peerKey: r.peerKey, pinned: r.pinned, waitAccept: r.waitAccept, shm: r.shm}
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

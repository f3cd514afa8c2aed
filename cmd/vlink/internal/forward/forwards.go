// Package forward runs the forwards of vlink's serving commands (serve,
// tunnel, socks): the listener and its accept loop, the relay of each
// connection with its metrics and --stats, a graceful shutdown, and the
// --forwards file that runs many forwards in one process; SIGHUP reads
// the file, or the command line's forward's inputs, again.
package forward

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
	"github.com/vlink-dev/vlink/internal/sdnotify"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/internal/tomlerr"
)

// A Forward is one listener of a serving command (serve, tunnel) and
// where its connections go, as the command line or one entry of a
// --forwards file gives it: checked, not yet listening.
type Forward interface {
	// Start listens, logging to e.log, and returns the listener, the
	// handler of each connection it accepts (run on its own goroutine),
	// and what to release once the forward has stopped and drained.
	Start(ctx context.Context, e *base.Env, t *Tracker) (l net.Listener, handle func(net.Conn), release func(), err error)
	// ListenAddr is --listen as written.
	ListenAddr() string
	// Inputs are what the forward read from files: its keys, the
	// routing configuration's digest. A reload restarts a forward whose
	// inputs changed, as one whose flags did.
	Inputs() [][]byte
}

// ProcessOptions are a serving command's flags that concern the whole
// process rather than one forward: a --forwards file's entries cannot
// give them.
type ProcessOptions struct {
	Forwards, metrics string
	grace, stats      time.Duration
}

// processFlags are the flags processOptions and withEnv define.
var processFlags = map[string]bool{"forwards": true, "grace": true, "metrics": true, "stats": true, "log-level": true, "log-format": true}

func (p *ProcessOptions) Flags(fs *flag.FlagSet) {
	fs.StringVar(&p.Forwards, "forwards", "", "run every forward listed in the TOML `FILE`, one [[forward]] table each, whose keys are this command's flags with underscores for dashes, as the routing configuration's (listen = \"127.0.0.1:8080\", key_file = \"vlink.key\"; a repeatable flag takes a list; relative FILE values are in the file's folder; the dashed form, key-file, still works for now, with a warning); SIGHUP rereads it: new forwards start, removed ones stop accepting and drain for --grace, unchanged ones keep their connections, and a file with an error is refused, with the reason logged, while the running forwards stay. The other flags of this list are the process's and stay on the command line (default: the one forward the flags give, which SIGHUP restarts if its key files or routing configuration changed)")
	base.GraceVar(fs, &p.grace)
	metrics.FlagVar(fs, &p.metrics)
	StatsVar(fs, &p.stats)
}

// newForward defines one forward's flags on fs and returns the check
// that makes the forward once they are set.
type newForward func(fs *flag.FlagSet) func(*base.Env) (Forward, error)

// Run runs the command: the forward the command line gives, made by
// prepare, or with --forwards the file's, each made by entry. SIGHUP
// reads again what they were made from: the file, or for the command
// line's forward its key files and routing configuration.
func (p *ProcessOptions) Run(ctx context.Context, e *base.Env, fs *flag.FlagSet, prepare func(*base.Env) (Forward, error), entry newForward) error {
	if p.grace < 0 || p.stats < 0 {
		return base.Usagef("--grace and --stats want durations of 0 or more")
	}
	if p.Forwards == "" {
		load := func() ([]Entry, error) {
			f, err := prepare(e)
			if err != nil {
				return nil, err
			}
			return []Entry{{Name: f.ListenAddr(), Id: entryID(fs, f.Inputs()), env: e, F: f}}, nil
		}
		entries, err := load()
		if err != nil {
			return err
		}
		return p.run(ctx, e, &forwardSet{load: load, from: []any{"from", "the command line"}}, entries)
	}
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if !processFlags[f.Name] {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) > 0 {
		return base.Usagef("%s with --forwards: each forward's settings go in the file, as keys of its [[forward]] table (%s = ...); only --%s apply to the whole process",
			strings.Join(given, ", "), given[0][2:], strings.Join(slices.Sorted(maps.Keys(processFlags)), ", --"))
	}
	return p.RunFile(ctx, e, entry)
}

// notify tells systemd the service's state, when it started us with
// Type=notify; a failure is worth a warning, not an exit.
func notify(e *base.Env, states ...string) {
	if err := sdnotify.Notify(states...); err != nil {
		e.Log.Warn("cannot tell systemd the service's state", "err", err)
	}
}

// RunFile runs the forwards of the --forwards file until ctx ends,
// rereading it on SIGHUP.
func (p *ProcessOptions) RunFile(ctx context.Context, e *base.Env, entry newForward) error {
	load := func() ([]Entry, error) { return Load(p.Forwards, e, entry) }
	entries, err := load()
	if err != nil {
		return base.Usagef("%v", err)
	}
	return p.run(ctx, e, &forwardSet{load: load, from: []any{"file", p.Forwards}, file: true}, entries)
}

// run runs s's forwards, entries to begin with, until ctx ends, and
// applies s.load's on SIGHUP.
func (p *ProcessOptions) run(ctx context.Context, e *base.Env, s *forwardSet, entries []Entry) error {
	m, stopMetrics, err := metrics.Serve(ctx, e, p.metrics)
	if err != nil {
		return err
	}
	defer stopMetrics()
	s.p, s.e, s.m, s.stats = p, e, m, &statsGroup{}
	s.ended, s.quit = make(chan *runningForward), make(chan struct{})
	defer StartStats(e.Log, p.stats, s.stats)() // before a forward says it listens: SIGUSR1 is ours then
	hup := make(chan os.Signal, 1)
	notifyReload(hup)
	defer stopReload(hup)
	defer s.wait()
	if _, err := s.apply(ctx, entries); err != nil {
		s.stopAll()
		return err
	}
	m.Reloaded(true)
	if s.file {
		e.Log.Info("running forwards", "file", p.Forwards, "count", len(s.running))
	}
	notify(e, sdnotify.Ready, s.status())
	for {
		select {
		case <-ctx.Done():
			notify(e, sdnotify.Stopping)
			return nil // each forward drains, and wait waits for them
		case <-hup:
			notify(e, sdnotify.Reloading())
			s.reload(ctx)
			notify(e, sdnotify.Ready, s.status())
		case rf := <-s.ended:
			if !s.file && !rf.stopped {
				return rf.err // the command line's one forward failed: so has the command
			}
			if !s.ended1(rf) {
				s.stopAll()
				if rf.err == nil {
					return errors.New("every forward has stopped: none of the file's could start again")
				}
				return fmt.Errorf("every forward has stopped; the last: %w", rf.err)
			}
			if !rf.stopped {
				notify(e, s.status())
			}
		}
	}
}

// forwardsFile is the TOML form of a --forwards file.
type forwardsFile struct {
	Forward []map[string]any `toml:"forward"`
}

// A Entry is one entry of a --forwards file, checked.
type Entry struct {
	Name string // the entry's name key, else its listen address: in every log line of the forward
	Id   string // its settings and secrets: a reload keeps a running forward whose id is unchanged
	env  *base.Env
	F    Forward
}

// Load reads and checks every entry of the --forwards file path,
// each made by entry; any error refuses the whole file.
func Load(path string, e *base.Env, entry newForward) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--forwards: %w", err)
	}
	var ff forwardsFile
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ff); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) {
			return nil, fmt.Errorf("%w: only [[forward]] tables belong in the file", tomlerr.New(path, err))
		}
		return nil, tomlerr.New(path, err)
	}
	if len(ff.Forward) == 0 {
		return nil, fmt.Errorf("%s: no [[forward]] table: give each forward one, with this command's flags as its keys", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--forwards: %w", err)
	}
	dir := filepath.Dir(path)
	names := map[string]int{}
	listens := map[string]int{}
	ids := map[string]int{}
	var out []Entry
	var passwords bool
	dashed := map[string]bool{} // keys written the old way
	for i, kv := range ff.Forward {
		where := fmt.Sprintf("%s: forward %d", path, i+1)
		fs := flag.NewFlagSet(where, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		prepare := entry(fs)
		name, old, err := setFlags(fs, kv, dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		for _, k := range old {
			dashed[k] = true
		}
		listen := fs.Lookup("listen").Value.String()
		if _, port, _ := net.SplitHostPort(listen); port != "0" {
			if udp := fs.Lookup("udp"); udp != nil && udp.Value.String() == "true" {
				listen = "udp " + listen // beside a TCP forward on the same port
			}
			if j, dup := listens[listen]; dup {
				return nil, fmt.Errorf("%s: forward %d listens on %s already", where, j, listen)
			}
			listens[listen] = i + 1
		}
		if name == "" {
			name = listen
			if names[name] != 0 { // two on port 0
				name = fmt.Sprintf("%s #%d", listen, i+1)
			}
		} else if j, dup := names[name]; dup {
			return nil, fmt.Errorf("%s: forward %d has the same name, %q: give each a name of its own", where, j, name)
		}
		names[name] = i + 1
		fe := *e
		fe.Log = e.Log.With("forward", name)
		fe.ForwardsFile, fe.Forward = path, name
		f, err := prepare(&fe)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, name, err)
		}
		id := entryID(fs, f.Inputs())
		if j, dup := ids[id]; dup {
			return nil, fmt.Errorf("%s: the same forward as forward %d", where, j)
		}
		ids[id] = i + 1
		id = entryID(fs, f.Inputs(), name)
		fs.VisitAll(func(fl *flag.Flag) {
			if secret.HasPassword(fl.Value.String()) {
				passwords = true
			}
		})
		out = append(out, Entry{Name: name, Id: id, env: &fe, F: f})
	}
	if len(dashed) > 0 {
		var want []string
		for _, k := range slices.Sorted(maps.Keys(dashed)) {
			want = append(want, Key(k))
		}
		e.Log.Warn("the forwards file's keys are written with underscores now, as the routing configuration's: the dashed ones still work, for now",
			"file", path, "write", strings.Join(want, ", "))
	}
	if passwords && fi.Mode().Perm()&0o077 != 0 {
		e.Log.Warn("the forwards file holds a password and other users of this machine can read it: run chmod 600 on it, or give the layers password-file=FILE or password-env=VAR",
			"file", path, "mode", fi.Mode().Perm().String())
	}
	return out, nil
}

// Key is the --forwards file's key for the flag named flag: its name
// with underscores for dashes (key_file for --key-file), as the routing
// configuration writes its keys.
func Key(flag string) string { return strings.ReplaceAll(flag, "-", "_") }

// setFlags gives fs the entry's keys as flags, FILE values relative to
// dir, and returns the entry's name key (empty: none) and the keys
// written the old way, with dashes.
func setFlags(fs *flag.FlagSet, kv map[string]any, dir string) (name string, dashed []string, err error) {
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		v := kv[k]
		if k == "name" {
			if s, ok := v.(string); ok && s != "" && !strings.ContainsAny(s, "\n\r") {
				name = s
				continue
			}
			return "", nil, fmt.Errorf("name = %s: want a one-line string", shown(v))
		}
		flagName := strings.ReplaceAll(k, "_", "-")
		if flagName != k && strings.Contains(k, "-") {
			return "", nil, unknownKey(fs, k) // both ways at once
		}
		if processFlags[flagName] {
			return "", nil, fmt.Errorf("%s applies to the whole process, not to one forward: give --%s on the command line", k, flagName)
		}
		f := fs.Lookup(flagName)
		if f == nil {
			return "", nil, unknownKey(fs, k)
		}
		if strings.Contains(k, "-") {
			dashed = append(dashed, k)
		}
		isBool := false
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			isBool = true
		}
		_, isList := f.Value.(*base.ListFlag)
		var vals []string
		switch v := v.(type) {
		case bool:
			if !isBool {
				return "", nil, fmt.Errorf("%s = %v: want a string", k, v)
			}
			vals = []string{strconv.FormatBool(v)}
		case string:
			if isBool {
				return "", nil, fmt.Errorf("%s = %q: want true or false, unquoted", k, v)
			}
			vals = []string{v}
		case []any:
			if !isList {
				return "", nil, fmt.Errorf("%s takes one value, not a list", k)
			}
			for _, x := range v {
				s, ok := x.(string)
				if !ok {
					return "", nil, fmt.Errorf("%s: %s in the list: want strings", k, shown(x))
				}
				vals = append(vals, s)
			}
		default:
			want := "a string"
			switch {
			case isBool:
				want = "true or false"
			case isList:
				want = "a string or a list of strings"
			}
			return "", nil, fmt.Errorf("%s = %s: want %s (a duration is written \"10s\")", k, shown(v), want)
		}
		placeholder, _ := flag.UnquoteUsage(f)
		for _, s := range vals {
			if placeholder == "FILE" && s != "" && !filepath.IsAbs(s) && !(flagName == "known-nodes" && s == "none") {
				s = filepath.Join(dir, s)
			}
			if placeholder == "DURATION" {
				if _, err := time.ParseDuration(s); err != nil {
					return "", nil, fmt.Errorf("%s = %q: %v", k, s, err) // the flag's own says "parse error"
				}
			}
			if err := fs.Set(flagName, s); err != nil {
				return "", nil, fmt.Errorf("%s = %q: %v", k, s, err)
			}
		}
	}
	return name, dashed, nil
}

// shown is a value of the file as an error shows it: a table's or a
// list's content may be a stack's, passwords and all.
func shown(v any) string {
	switch v.(type) {
	case map[string]any:
		return "{...}"
	case []any:
		return "[...]"
	}
	return fmt.Sprint(v)
}

// unknownKey explains a key that is not one of the command's flags.
func unknownKey(fs *flag.FlagSet, k string) error {
	// Written with its separators wrong, or without them?
	bare := strings.NewReplacer("-", "", "_", "").Replace(k)
	var match string
	fs.VisitAll(func(f *flag.Flag) {
		if strings.ReplaceAll(f.Name, "-", "") == bare {
			match = Key(f.Name)
		}
	})
	if match != "" {
		return fmt.Errorf("unknown key %q: did you mean %s? The keys are the flags' names, with underscores", k, match)
	}
	var keys []string
	fs.VisitAll(func(f *flag.Flag) { keys = append(keys, Key(f.Name)) })
	return fmt.Errorf("unknown key %q: the keys are name and the flags of one forward, with underscores: %s", k, strings.Join(keys, ", "))
}

// entryID sums up an entry: every flag's value (defaults included, so
// that writing a default out changes nothing), the secrets it read, and
// the names given.
func entryID(fs *flag.FlagSet, inputs [][]byte, names ...string) string {
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "name=%q\n", n)
	}
	fs.VisitAll(func(f *flag.Flag) { fmt.Fprintf(h, "%s=%q\n", f.Name, f.Value.String()) })
	for _, s := range inputs {
		fmt.Fprintf(h, "input %d %x\n", len(s), sha256.Sum256(s))
	}
	return string(h.Sum(nil))
}

// forwardSet runs the forwards of a --forwards file, or the command
// line's one, and applies its reloads. Only run's goroutine touches it,
// but for the channels.
type forwardSet struct {
	p       *ProcessOptions
	e       *base.Env
	m       *metrics.Metrics
	load    func() ([]Entry, error) // what the forwards are now
	from    []any                   // where load reads them, for the log
	file    bool                    // from a --forwards file
	stats   *statsGroup
	running []*runningForward // in the file's order
	// ended gets each forward whose accept loop has returned and
	// drained, until quit is closed.
	ended chan *runningForward
	quit  chan struct{}
	wg    sync.WaitGroup // the accept loops
}

// A runningForward is a forward that listens.
type runningForward struct {
	Entry
	ctx     context.Context // ends when the forward stops
	t       *Tracker
	l       net.Listener
	handle  func(net.Conn)
	release func()
	cancel  context.CancelFunc
	stopped bool          // stopped by a reload, not by its own failure
	done    chan struct{} // closed when the accept loop has drained
	err     error         // why the accept loop returned; set before done
}

// open starts fe listening; serve runs its accept loop.
func (s *forwardSet) open(ctx context.Context, fe Entry) (*runningForward, error) {
	ctx, cancel := context.WithCancel(ctx)
	rf := &runningForward{Entry: fe, ctx: ctx, t: NewTracker(s.m), cancel: cancel, done: make(chan struct{})}
	var err error
	if rf.l, rf.handle, rf.release, err = fe.F.Start(ctx, fe.env, rf.t); err != nil {
		cancel()
		if !s.file {
			return nil, err // the command line's: no name to give
		}
		return nil, fmt.Errorf("forward %s: %w", fe.Name, err)
	}
	s.stats.add(rf.t)
	return rf, nil
}

// abort undoes an open whose accept loop never ran.
func (s *forwardSet) abort(rf *runningForward) {
	rf.cancel()
	rf.l.Close()
	rf.release()
	s.stats.retire(rf.t)
}

func (s *forwardSet) serve(rf *runningForward) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		rf.err = rf.t.AcceptLoop(rf.ctx, rf.env.Log, rf.l, s.p.grace, func(c net.Conn) {
			rf.t.Spawn(func() { rf.handle(c) })
		})
		rf.release()
		s.stats.retire(rf.t)
		close(rf.done)
		select {
		case s.ended <- rf:
		case <-s.quit:
		}
	}()
}

// stop makes rf stop accepting at once (its port is free when stop
// returns) and drain its connections for --grace.
func (s *forwardSet) stop(rf *runningForward) {
	rf.stopped = true
	rf.cancel() // first, so that the accept loop takes the close for a shutdown
	rf.l.Close()
}

// stopAll stops every forward; wait waits for them to drain.
func (s *forwardSet) stopAll() {
	for _, rf := range s.running {
		s.stop(rf)
	}
}

func (s *forwardSet) wait() {
	close(s.quit)
	s.wg.Wait()
}

// ended1 takes note of a forward whose accept loop returned, and
// reports whether any forward still runs.
func (s *forwardSet) ended1(rf *runningForward) bool {
	if !rf.stopped {
		rf.env.Log.Error("forward stopped; SIGHUP starts it again", "err", rf.err)
		s.running = slices.DeleteFunc(s.running, func(x *runningForward) bool { return x == rf })
	}
	return len(s.running) > 0
}

// attrs are a log record's attributes: where the forwards come from,
// then kv.
func (s *forwardSet) attrs(kv ...any) []any { return slices.Concat(s.from, kv) }

// reload reads the forwards again and applies them; an error in what
// it reads changes nothing.
func (s *forwardSet) reload(ctx context.Context) {
	entries, err := s.load()
	if err != nil {
		s.m.Reloaded(false)
		s.e.Log.Error("reload refused: the forwards keep running as they were", s.attrs("running", len(s.running), "err", err)...)
		return
	}
	before := make(map[string]bool, len(s.running))
	for _, rf := range s.running {
		before[rf.Id] = true
	}
	if changed, err := s.apply(ctx, entries); !changed {
		s.m.Reloaded(false)
		s.e.Log.Error("reload refused: the forwards keep running as they were", s.attrs("running", len(s.running), "err", err)...)
		return
	} else if err != nil {
		s.m.Reloaded(false)
		s.e.Log.Error("reload incomplete: the forwards that could not start stay down until the next", s.attrs("running", len(s.running), "err", err)...)
		return
	}
	s.m.Reloaded(true)
	kept := 0
	for _, fe := range entries {
		if before[fe.Id] {
			kept++
		}
	}
	s.e.Log.Info("reloaded", s.attrs("running", len(s.running), "unchanged", kept,
		"started", len(entries)-kept, "stopped", len(before)-kept)...)
}

// apply makes the running forwards those of entries: a running forward
// whose entry is unchanged keeps running, with its connections; the
// others stop accepting and drain, and the new ones start. Should a new
// forward fail to listen on a port no stopping forward holds, nothing
// has changed: changed is false. Should one fail on the port a stopped
// forward freed, the others have changed and err says which failed.
func (s *forwardSet) apply(ctx context.Context, entries []Entry) (changed bool, err error) {
	stopping := map[string]*runningForward{}
	for _, rf := range s.running {
		select {
		case <-rf.done: // failed on its own: started again below
		default:
			stopping[rf.Id] = rf
		}
	}
	next := make([]*runningForward, len(entries))
	for i, fe := range entries {
		if rf, ok := stopping[fe.Id]; ok {
			next[i] = rf
			delete(stopping, fe.Id)
		}
	}
	held := map[string]bool{} // the ports of the forwards to stop
	for _, rf := range stopping {
		held[portKey(rf.F.ListenAddr())] = true
	}
	// Those that take a free port first, so that a port someone else
	// holds refuses the reload before anything stops.
	var opened []*runningForward
	for i, fe := range entries {
		if next[i] != nil || held[portKey(fe.F.ListenAddr())] {
			continue
		}
		rf, err := s.open(ctx, fe)
		if err != nil {
			for _, rf := range opened {
				s.abort(rf)
			}
			return false, err
		}
		next[i] = rf
		opened = append(opened, rf)
	}
	for _, rf := range stopping {
		rf.env.Log.Info("stopping: no longer in the file, or changed", "active", rf.t.active(), "grace", s.p.grace)
		s.stop(rf)
	}
	var errs []error
	for i, fe := range entries {
		if next[i] != nil {
			continue
		}
		rf, err := s.open(ctx, fe)
		if err != nil {
			fe.env.Log.Error("cannot start; SIGHUP tries again", "err", err)
			errs = append(errs, err)
			continue
		}
		next[i] = rf
		opened = append(opened, rf)
	}
	s.running = slices.DeleteFunc(next, func(rf *runningForward) bool { return rf == nil })
	for _, rf := range opened {
		s.serve(rf)
	}
	return true, errors.Join(errs...)
}

// portKey is what a forward listening on listen (a ListenAddr) holds,
// whatever its host is written as: localhost:7000 and 127.0.0.1:7000
// hold the same port, so a forward that changes from one to the other
// waits for the old one to stop. Port 0 holds nothing it can name.
func portKey(listen string) string {
	proto, addr := "tcp", listen
	if a, ok := strings.CutPrefix(listen, "udp "); ok {
		proto, addr = "udp", a
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" {
		return ""
	}
	return proto + "/" + port
}

// status is the line systemctl status shows.
func (s *forwardSet) status() string {
	if !s.file {
		return sdnotify.Status(fmt.Sprintf("%d forward running from the command line", len(s.running)))
	}
	return sdnotify.Status(fmt.Sprintf("%d forwards running from %s", len(s.running), s.p.Forwards))
}

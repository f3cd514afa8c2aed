// Package launch is the worker's side of "vlink launch": a process the
// launcher started learns from its environment its rank, the job's size
// and the job's relay, joins the job's vlink network under its rank's
// node name, and reaches the other ranks by rank, whatever path the
// network finds between them (a connection back, a spliced one, or the
// relay); ranks on one host talk over shared memory (local.go), unless
// $VLINK_SHM (vlink.EnvShm) says off; on makes Join fail where shared
// memory does not set up.
//
//	job, err := launch.Join(ctx)
//	l, err := job.Listen()              // connections from the other ranks
//	c, err := job.Dial(ctx, 3, 5000)    // rank 3's port 5000
//	err = job.Barrier(ctx)              // every rank got here
//
// The launcher runs the job's relay with a key of its own, made for the
// job, and gives each worker only its node key, in a file only the user
// reads: a process outside the job cannot join it, nor pose as a rank.
package launch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

// The environment a worker runs with.
const (
	EnvRank        = "VLINK_RANK"          // this worker's rank, 0 to VLINK_SIZE-1
	EnvSize        = "VLINK_SIZE"          // how many workers the job has
	EnvRelay       = "VLINK_RELAY"         // the job's relay, host:port
	EnvNode        = "VLINK_NODE"          // this worker's node name, RankName(rank)
	EnvNodeKeyFile = "VLINK_NODE_KEY_FILE" // its node key: a file of mode 600
	EnvJob         = "VLINK_JOB"           // the job's id, 32 hex digits: ranks of one host find each other by it
)

// MaxSize bounds a job's size.
const MaxSize = 4096

// ErrNotLaunched: the environment names no job; the process was not
// started by vlink launch.
var ErrNotLaunched = errors.New("launch: not started by vlink launch (no " + EnvRank + ")")

// RankName is the node name of rank r in its job's network: rank r is
// reached at RankName(r)+vlink.NodeSuffix.
func RankName(r int) string { return "rank" + strconv.Itoa(r) }

// A Job is a worker's view of its job.
type Job struct {
	Rank, Size int

	node *control.Node
	l    *listener
	d    *vlink.Dialer

	job    string         // EnvJob
	shm    namedTransport // to the ranks of this host; nil: none
	shmErr error          // why not, when shm is nil
	remote []atomic.Bool  // by rank: joined, and not on this host

	barrierMu sync.Mutex // one Barrier at a time
	gen       uint64     // the last barrier's generation
	arrivals  *arrivals  // rank 0's
}

// Message types of the job's barrier, among those vlink keeps.
const (
	typeArrive  = control.FirstReserved + 0x10 // to rank 0: a rank reached barrier N (payload: N)
	typeRelease = control.FirstReserved + 0x11 // from rank 0: every rank reached it
)

// arrivals are the other ranks' arrivals at rank 0's barriers, by
// generation and rank.
type arrivals struct {
	mu      sync.Mutex
	by      map[uint64]map[string]*control.Message
	changed chan struct{} // closed, and replaced, at each arrival
}

// Join joins the job the process's environment describes, with ctx
// bounding the registration with the relay.
func Join(ctx context.Context) (*Job, error) { return JoinEnv(ctx, os.Getenv) }

// JoinEnv is Join with the environment read through getenv: a program
// that runs several workers of a job itself gives each its own.
func JoinEnv(ctx context.Context, getenv func(string) string) (*Job, error) {
	rs := getenv(EnvRank)
	if rs == "" {
		return nil, ErrNotLaunched
	}
	rank, err1 := strconv.Atoi(rs)
	size, err2 := strconv.Atoi(getenv(EnvSize))
	if err1 != nil || err2 != nil || size < 1 || size > MaxSize || rank < 0 || rank >= size {
		return nil, fmt.Errorf("launch: %s=%q, %s=%q: want a rank below a size of 1 to %d", EnvRank, rs, EnvSize, getenv(EnvSize), MaxSize)
	}
	relay, name := getenv(EnvRelay), getenv(EnvNode)
	if relay == "" || name != RankName(rank) {
		return nil, fmt.Errorf("launch: %s=%q, %s=%q: want the job's relay, and %s", EnvRelay, relay, EnvNode, name, RankName(rank))
	}
	key, err := vlink.ReadKeyFile(getenv(EnvNodeKeyFile))
	if err != nil {
		return nil, fmt.Errorf("launch: %s: %w", EnvNodeKeyFile, err)
	}
	j := &Job{Rank: rank, Size: size, job: getenv(EnvJob)}
	var local net.Listener
	switch {
	case j.job == "":
		j.shmErr = fmt.Errorf("launch: %s is not set: vlink launch sets it", EnvJob)
	case !validJobID(j.job):
		return nil, fmt.Errorf("launch: %s=%q: want 32 hexadecimal digits", EnvJob, j.job)
	case getenv(vlink.EnvShm) == string(vlink.ShmOff):
		j.shmErr = fmt.Errorf("launch: %s=off keeps this rank off shared memory", vlink.EnvShm)
	default:
		mode := vlink.ShmMode(getenv(vlink.EnvShm))
		if mode != vlink.ShmDefault && mode != vlink.ShmAuto && mode != vlink.ShmOn {
			return nil, fmt.Errorf("launch: %s=%q: want auto, on or off", vlink.EnvShm, mode)
		}
		// Listening before the rank registers: a rank that sees this
		// one joined finds it on this host at once.
		if j.shm, j.shmErr = sharedMemory(); j.shmErr == nil {
			local, j.shmErr = j.shm.ListenName(localName(j.job, rank))
		}
		if j.shmErr != nil {
			j.shm = nil
			if mode == vlink.ShmOn {
				return nil, fmt.Errorf("launch: %s=on, and shared memory between ranks does not set up: %w", vlink.EnvShm, j.shmErr)
			}
		}
	}
	defer func() {
		if j.l == nil && local != nil {
			local.Close() // Join failed
		}
	}()
	cfg := control.Config{Name: name, Key: key, Relays: []string{relay}}
	if rank == 0 {
		// In place before rank 0 registers: the other ranks send their
		// arrivals as soon as the relay knows it.
		j.arrivals = &arrivals{by: map[uint64]map[string]*control.Message{}, changed: make(chan struct{})}
		cfg.Handlers = map[control.Type]control.Handler{typeArrive: j.arrivals.arrive}
	}
	node, err := control.Connect(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("launch: joining the job's relay at %s as %s: %w", relay, name, err)
	}
	// Exposed at once, so that a rank that dials this one as soon as it
	// sees it joined is not refused: its connection waits in the
	// listener's backlog until Listen's caller accepts it.
	nl, err := node.Listen(func(from string, port uint16) error { return nil })
	if err != nil {
		node.Close()
		return nil, err
	}
	lc := vlink.ListenConfig{Policy: vlink.Policy{
		Targets: []selector.Rule{{Host: "localhost", Ports: "*", Action: selector.Direct}},
	}}
	l, err := lc.NewListener(nl)
	if err != nil {
		nl.Close()
		node.Close()
		return nil, err
	}
	j.node, j.l, j.d = node, newListener(l, local, rank, size), &vlink.Dialer{Network: node}
	if j.shm != nil {
		j.remote = make([]atomic.Bool, size)
	}
	return j, nil
}

// arrive takes a rank's arrival at one of rank 0's barriers.
func (a *arrivals) arrive(m *control.Message) {
	if len(m.Payload) != 8 || m.Via != "" {
		return
	}
	gen := binary.BigEndian.Uint64(m.Payload)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by[gen] == nil {
		a.by[gen] = map[string]*control.Message{}
	}
	a.by[gen][m.From] = m // a rank's node name is proven: it counts once
	close(a.changed)
	a.changed = make(chan struct{})
}

// Barrier returns once every rank of the job has called it as many
// times as this one, or ctx ends. Every rank calls it in the same order;
// on one rank, one call at a time.
func (j *Job) Barrier(ctx context.Context) error {
	j.barrierMu.Lock()
	defer j.barrierMu.Unlock()
	j.gen++
	payload := binary.BigEndian.AppendUint64(nil, j.gen)
	if j.Size == 1 {
		return nil
	}
	if j.Rank != 0 {
		// Rank 0 may not have joined yet: the relay says so, and the
		// arrival is sent again, as Dial does.
		for wait := 5 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
			coop := j.node.Cooperate(control.Expect{From: RankName(0), Type: typeRelease})
			err := coop.Send(ctx, RankName(0), typeArrive, payload)
			if err == nil {
				_, err = coop.Wait(ctx)
			}
			coop.Cancel()
			if err == nil {
				return nil
			}
			if !errors.Is(err, control.ErrNoNode) || ctx.Err() != nil {
				return fmt.Errorf("launch: barrier %d: %w", j.gen, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("launch: barrier %d: rank 0 has not joined: %w", j.gen, ctx.Err())
			case <-time.After(wait):
			}
		}
	}
	a := j.arrivals
	for {
		a.mu.Lock()
		got, changed := a.by[j.gen], a.changed
		if len(got) == j.Size-1 {
			delete(a.by, j.gen)
			a.mu.Unlock()
			for _, m := range got {
				if err := m.Reply(ctx, typeRelease, payload); err != nil {
					return fmt.Errorf("launch: barrier %d: releasing %s: %w", j.gen, m.From, err)
				}
			}
			return nil
		}
		a.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("launch: barrier %d: %d of %d ranks arrived: %w", j.gen, len(got)+1, j.Size, ctx.Err())
		}
	}
}

// Dial connects to port (1 to 65535) on rank r: over shared memory
// when r runs on this host (PathOf says "shm"), else through the job's
// network. A rank that has not joined yet, or joined but does not take
// connections yet (Join registers, then exposes the rank), is waited
// for until ctx ends: the ranks of a job start in any order. A rank
// refuses nothing else.
func (j *Job) Dial(ctx context.Context, r, port int) (net.Conn, error) {
	if r < 0 || r >= j.Size {
		return nil, fmt.Errorf("launch: rank %d: the job has ranks 0 to %d", r, j.Size-1)
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("launch: port %d: want 1 to 65535", port)
	}
	addr := net.JoinHostPort(RankName(r)+vlink.NodeSuffix, strconv.Itoa(port))
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		c, network := j.tryLocal(ctx, r, port)
		if c != nil {
			return c, nil
		}
		var err error
		if network {
			c, err = j.d.DialContext(ctx, "tcp", addr)
			if !errors.Is(err, control.ErrNoNode) && !errors.Is(err, control.ErrRefused) {
				return c, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("launch: rank %d has not joined, or takes no connections: %w", r, errors.Join(err, ctx.Err()))
		case <-time.After(wait):
		}
	}
}

// Listen returns the listener of the connections the other ranks dial
// to this one, whatever their port, through the job's network and over
// shared memory: RankOf says which rank dialed, PortOf which port it
// asked for. Connections dialed before Listen was called wait for it.
// Every call returns the same listener; closing it stops the rank
// taking connections.
func (j *Job) Listen() (net.Listener, error) { return j.l, nil }

// SharedMemory reports whether the ranks of this host reach this one
// over shared memory: nil if they do, else why not (not started by a
// vlink launch that names the job, VLINK_SHM=off, or not Linux).
func (j *Job) SharedMemory() error { return j.shmErr }

// RankOf returns the rank that dialed c, a connection Listen accepted,
// or -1.
func RankOf(c net.Conn) int {
	if lc, ok := c.(*localConn); ok {
		return lc.rank
	}
	vc, ok := c.(*vlink.Conn)
	if !ok || vc.Hello() == nil {
		return -1
	}
	name := vc.Hello().Node
	if len(name) < 5 || name[:4] != "rank" {
		return -1
	}
	r, err := strconv.Atoi(name[4:])
	if err != nil || RankName(r) != name {
		return -1
	}
	return r
}

// Close leaves the job's network: the connections made through it end.
func (j *Job) Close() error {
	j.l.Close()
	j.d.Close()
	return j.node.Close()
}

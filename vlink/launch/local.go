package launch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
)

// Ranks on one host reach each other over shared memory, as pscom and
// PadicoTM's launcher do within a node: each rank listens under a name
// made of the job's id and its rank (a unix socket in a folder of the
// user's own, package factories/shm), so a rank finds another on its
// host with no exchange at all, and one elsewhere costs a failed
// connect to a missing socket file before the job's network is used.
//
// The bytes stay in memory the two processes share, and the socket
// admits processes of the same user only: the connection is not
// encrypted, and the dialing rank's number is taken as it says, as
// between any two processes of one user (who can read each other's
// key files). The dialer sends a hello, the listener answers:
//
//	hello  = version u8 | rank u32 | port u16
//	answer = code u8 (localOK, or localRefused)
const (
	localVersion   = 1
	localHelloSize = 1 + 4 + 2
	localOK        = 0
	localRefused   = 1
	// localTimeout bounds a local connection's hello, both ends.
	localTimeout = 10 * time.Second
	// localBacklog bounds the local connections set up and not yet
	// accepted; beyond it, dialers are refused and take the network.
	localBacklog = 128
)

// A namedTransport listens and dials by name on this host: shared
// memory (package factories/shm) on Linux.
type namedTransport interface {
	ListenName(name string) (net.Listener, error)
	DialName(ctx context.Context, name string) (net.Conn, error)
	RemoveName(name string) error
}

// CleanUp removes what rank r of job may have left on this host: its
// shared-memory socket, which a process that exits without Job.Close
// leaves. vlink launch calls it once the rank's process has ended.
func CleanUp(job string, r int) error {
	if !validJobID(job) {
		return fmt.Errorf("launch: job id %q: want 32 hexadecimal digits", job)
	}
	t, err := sharedMemory()
	if err != nil {
		return nil // nothing was left
	}
	return t.RemoveName(localName(job, r))
}

// localName is the name rank r of job listens under.
func localName(job string, r int) string { return "job-" + job + "-rank" + strconv.Itoa(r) }

// validJobID reports whether id is a job id as vlink launch makes them:
// 32 lowercase hexadecimal digits.
func validJobID(id string) bool {
	return len(id) == 32 && strings.Trim(id, "0123456789abcdef") == ""
}

type localHello struct {
	rank uint32
	port uint16
}

func (h localHello) append(b []byte) []byte {
	b = append(b, localVersion)
	b = binary.BigEndian.AppendUint32(b, h.rank)
	return binary.BigEndian.AppendUint16(b, h.port)
}

// errLocalHello is matched by the error for a local hello that breaks
// the format.
var errLocalHello = errors.New("launch: malformed hello from a rank on this host")

// parseLocalHello decodes a hello from a rank of a job of size ranks.
func parseLocalHello(b []byte, size int) (localHello, error) {
	if len(b) != localHelloSize || b[0] != localVersion {
		return localHello{}, fmt.Errorf("%w: % x", errLocalHello, b)
	}
	h := localHello{rank: binary.BigEndian.Uint32(b[1:]), port: binary.BigEndian.Uint16(b[5:])}
	if int64(h.rank) >= int64(size) || h.port == 0 {
		return localHello{}, fmt.Errorf("%w: rank %d, port %d in a job of %d", errLocalHello, h.rank, h.port, size)
	}
	return h, nil
}

// errLocalRefused: the rank's listener was closed, or had as many
// connections waiting as it keeps.
var errLocalRefused = errors.New("launch: the rank refused the connection over shared memory")

// tryLocal connects to port on rank r over shared memory if r runs on
// this host. Otherwise it returns nil, and whether the job's network is
// worth a dial: not while r has not joined.
//
// A rank listens here before it registers with the relay (Join), so a
// rank the relay knows, and that does not listen here, runs elsewhere:
// that is remembered, and the next dials to it go straight to the
// network. Asking the relay closes the race where r starts listening
// just after a first try here, and registers before the network's dial.
func (j *Job) tryLocal(ctx context.Context, r, port int) (c net.Conn, network bool) {
	if j.shm == nil || j.remote[r].Load() {
		return nil, true
	}
	c, err := j.dialLocal(ctx, r, port)
	switch {
	case err == nil:
		return c, false
	case !notListening(err):
		return nil, true // it listens, and the set-up failed: the network will do
	}
	p, err := j.node.Lookup(ctx, RankName(r))
	switch {
	case err != nil:
		return nil, true // the network's dial says what is wrong
	case !p.Online:
		return nil, false
	}
	if c, err = j.dialLocal(ctx, r, port); err == nil {
		return c, false
	}
	if notListening(err) {
		j.remote[r].Store(true)
	}
	return nil, true
}

// notListening reports whether a local dial failed for want of a
// listener: no socket, or one whose process is gone.
func notListening(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)
}

// dialLocal connects to port on rank r over shared memory. It fails
// when r runs on another host, has not joined yet, or takes no
// connections: the job's network decides then.
func (j *Job) dialLocal(ctx context.Context, r, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, localTimeout)
	defer cancel()
	c, err := j.shm.DialName(ctx, localName(j.job, r))
	if err != nil {
		return nil, err
	}
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	stop := netconn.InterruptOnDone(ctx, c)
	_, err = c.Write(localHello{rank: uint32(j.Rank), port: uint16(port)}.append(nil))
	var answer [1]byte
	if err == nil {
		_, err = io.ReadFull(c, answer[:])
	}
	if !stop() && ctx.Err() != nil {
		err = ctx.Err()
	}
	if err == nil && answer[0] != localOK {
		err = errLocalRefused
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return &localConn{Conn: c, local: control.Addr{Node: RankName(j.Rank)}, remote: control.Addr{Node: RankName(r), Port: uint16(port)}, rank: r, port: port}, nil
}

// A localConn is a connection between two ranks of one host, over
// shared memory.
type localConn struct {
	net.Conn
	local, remote control.Addr
	rank, port    int // the other rank; the port dialed
}

var (
	_ net.Conn                   = (*localConn)(nil)
	_ netconn.Unwrapper          = (*localConn)(nil)
	_ netconn.CloseWriter        = (*localConn)(nil)
	_ io.ReaderFrom              = (*localConn)(nil)
	_ io.WriterTo                = (*localConn)(nil)
	_ interface{ Path() string } = (*localConn)(nil)
)

func (c *localConn) LocalAddr() net.Addr                 { return c.local }
func (c *localConn) RemoteAddr() net.Addr                { return c.remote }
func (c *localConn) UnwrapConn() net.Conn                { return c.Conn }
func (c *localConn) CloseWrite() error                   { return netconn.CloseWrite(c.Conn) }
func (c *localConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }
func (c *localConn) WriteTo(w io.Writer) (int64, error)  { return io.Copy(w, c.Conn) }

// Path is "shm": the connection's bytes go through shared memory.
func (c *localConn) Path() string { return "shm" }

// A listener takes the connections of the other ranks: those through
// the job's network and those over shared memory.
type listener struct {
	network    net.Listener
	local      net.Listener // nil: no shared memory
	rank, size int
	addr       net.Addr
	conns      chan net.Conn
	done       chan struct{}
	once       sync.Once
	wg         sync.WaitGroup

	mu      sync.Mutex
	err     error                 // why a listener below failed: Accept's error from then on
	pending map[net.Conn]struct{} // local connections in their hello, or not yet accepted
}

func newListener(network, local net.Listener, rank, size int) *listener {
	l := &listener{network: network, local: local, rank: rank, size: size, addr: network.Addr(),
		conns: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.acceptFrom(network, func(c net.Conn) {
		select {
		case l.conns <- c:
		case <-l.done:
			c.Close()
		}
	})
	if local != nil {
		l.wg.Add(1)
		go l.acceptFrom(local, l.greet)
	}
	return l
}

// acceptFrom hands what below accepts to take, until below fails.
func (l *listener) acceptFrom(below net.Listener, take func(net.Conn)) {
	defer l.wg.Done()
	var backoff netconn.AcceptBackoff
	for {
		c, err := below.Accept()
		if err != nil {
			if backoff.Wait(err, l.done) {
				continue
			}
			l.fail(err)
			return
		}
		take(c)
	}
}

// fail ends the listener because one below it failed with err.
func (l *listener) fail(err error) {
	l.mu.Lock()
	select {
	case <-l.done: // closed: that is why
	default:
		l.err = err
	}
	l.mu.Unlock()
	l.stop()
}

// greet takes a local connection's hello and answers it, in a goroutine
// of its own, so a slow or broken dialer delays no other.
func (l *listener) greet(c net.Conn) {
	l.mu.Lock()
	closed, full := false, len(l.pending) >= localBacklog
	select {
	case <-l.done:
		// Accepted as the listener closed (the one below may hand over
		// a connection after): stop has closed the pending ones
		// already, and would not see this one.
		closed = true
	default:
		if !full {
			l.pending[c] = struct{}{}
		}
	}
	l.mu.Unlock()
	switch {
	case closed:
		c.Close()
		return
	case full:
		c.Write([]byte{localRefused})
		c.Close()
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer func() {
			l.mu.Lock()
			delete(l.pending, c)
			l.mu.Unlock()
		}()
		c.SetDeadline(time.Now().Add(localTimeout))
		b := make([]byte, localHelloSize)
		_, err := io.ReadFull(c, b)
		var h localHello
		if err == nil {
			h, err = parseLocalHello(b, l.size)
		}
		if err == nil {
			_, err = c.Write([]byte{localOK})
		}
		if err != nil {
			c.Close()
			return
		}
		c.SetDeadline(time.Time{})
		lc := &localConn{Conn: c, local: control.Addr{Node: RankName(l.rank), Port: h.port}, remote: control.Addr{Node: RankName(int(h.rank))}, rank: int(h.rank), port: int(h.port)}
		select {
		case l.conns <- lc:
		case <-l.done:
			c.Close()
		}
	}()
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return nil, &net.OpError{Op: "accept", Net: "vlink", Addr: l.addr, Err: err}
	}
}

// Close stops the rank taking connections, from the network and over
// shared memory; those not accepted yet are closed.
func (l *listener) Close() error {
	l.stop()
	l.wg.Wait()
	return nil
}

func (l *listener) stop() {
	l.once.Do(func() {
		l.mu.Lock()
		close(l.done)
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
		l.network.Close()
		if l.local != nil {
			l.local.Close()
		}
	})
}

func (l *listener) Addr() net.Addr { return l.addr }

// PortOf returns the port the rank that dialed c asked for (Dial's
// port), for a connection Listen accepted, or -1.
func PortOf(c net.Conn) int {
	switch c := c.(type) {
	case *localConn:
		return c.port
	case *vlink.Conn:
		if c.Hello() == nil {
			return -1
		}
		_, ps, err := net.SplitHostPort(c.Hello().Target)
		if p, perr := strconv.ParseUint(ps, 10, 16); err == nil && perr == nil {
			return int(p)
		}
	}
	return -1
}

// PathOf says how a connection between ranks came: "shm" for shared
// memory between ranks of one host, or, on the dialing end of one
// through the job's network, its path there ("reverse", "splice" or
// "relay"); "" where it is not known.
func PathOf(c net.Conn) string {
	if p, ok := c.(interface{ Path() string }); ok {
		return p.Path()
	}
	return ""
}

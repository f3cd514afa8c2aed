//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// DefaultRingSize is each direction's ring when none is given.
const DefaultRingSize = defaultRings

func init() {
	layer.Register(layer.Spec{
		Name:     "shm",
		Kind:     layer.KindFactory,
		Terminal: true,
		Summary:  "shared memory between processes of one machine and one user: rings in a memfd, eventfd doorbells",
		Params: []layer.Param{
			{Name: "ring", Type: layer.TypeSize, Default: "1M", Min: minRingSize, Max: maxRingSize, Local: true,
				Doc: "each direction's ring, a power of two (the dialer chooses)"},
			{Name: "dir", Type: layer.TypeString, Local: true,
				Doc: "the folder of the listeners' unix sockets (default: vlink-shm-UID in the temporary folder)"},
		},
		EndMarker: true,
		New: func(a layer.Args) (any, error) {
			return New(Options{RingSize: int(a.Size("ring")), Dir: a.String("dir")})
		},
	})
}

// Options configure a Factory.
type Options struct {
	// RingSize is each direction's ring on the connections it dials, a
	// power of two from 4 KiB to 64 MiB. Zero means DefaultRingSize.
	RingSize int
	// Dir holds the listeners' unix sockets. Empty means vlink-shm-UID
	// in os.TempDir().
	Dir string
}

// Validate reports whether the options are usable.
func (o *Options) Validate() error {
	if o.RingSize != 0 && !validSize(o.RingSize) {
		return fmt.Errorf("shm: a ring of %d bytes: want a power of two from %d to %d", o.RingSize, minRingSize, maxRingSize)
	}
	return nil
}

// A Factory dials and listens on shared memory.
type Factory struct {
	size int
	dir  string
}

var _ layer.ListenFactory = (*Factory)(nil)

// New returns a factory with options o.
func New(o Options) (*Factory, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	f := &Factory{size: o.RingSize, dir: o.Dir}
	if f.size == 0 {
		f.size = DefaultRingSize
	}
	if f.dir == "" {
		f.dir = filepath.Join(os.TempDir(), "vlink-shm-"+strconv.Itoa(os.Getuid()))
	}
	return f, nil
}

func (f *Factory) String() string { return "shm " + f.dir }

// Addr is a shared-memory address: the host:port a listener, and the
// dialer's side of a connection, stand for; "pid:N" for the process at
// a connection's other end.
type Addr struct{ HostPort string }

func (a Addr) Network() string { return "shm" }
func (a Addr) String() string  { return a.HostPort }

// ErrNotLocal: shared memory reaches this machine only.
var ErrNotLocal = errors.New("shm: shared memory reaches only this machine's loopback addresses")

// port returns the port of address, a loopback host:port.
func port(address string) (int, error) {
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return 0, err
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return 0, fmt.Errorf("%w: %s", ErrNotLocal, host)
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("shm: port %q: %w", ps, err)
	}
	return int(p), nil
}

func (f *Factory) socketPath(port int) string {
	return filepath.Join(f.dir, "shm-"+strconv.Itoa(port)+".sock")
}

// DialContext connects to the shared-memory listener for address, a
// loopback host:port; ctx bounds the set-up.
func (f *Factory) DialContext(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Conn, error) {
	p, err := port(address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "shm", Addr: Addr{address}, Err: err}
	}
	return f.dial(ctx, f.socketPath(p), Addr{address})
}

// DialName connects to the listener ListenName(name) made, as
// DialContext does to a port's. A name no listener holds fails at once
// (the socket file is missing, or no process listens on it).
func (f *Factory) DialName(ctx context.Context, name string) (net.Conn, error) {
	if err := checkName(name); err != nil {
		return nil, &net.OpError{Op: "dial", Net: "shm", Addr: Addr{name}, Err: err}
	}
	return f.dial(ctx, f.namePath(name), Addr{name})
}

func (f *Factory) dial(ctx context.Context, path string, raddr Addr) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "shm", Addr: raddr, Err: err}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, opErr(err)
	}
	uc := c.(*net.UnixConn)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(layer.DefaultHandshakeTimeout)
	}
	uc.SetDeadline(deadline)
	sc, err := dialSetup(uc, f.size, raddr)
	if err != nil {
		uc.Close()
		return nil, opErr(err)
	}
	return sc, nil
}

// Listen listens for shared-memory connections for address, a loopback
// host:port; port 0 picks a port free on TCP too, and holds it there
// while the listener lives.
func (f *Factory) Listen(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Listener, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "listen", Net: "shm", Addr: Addr{address}, Err: err}
	}
	p, err := port(address)
	if err != nil {
		return nil, opErr(err)
	}
	if err := f.ownDir(); err != nil {
		return nil, opErr(err)
	}
	host, _, _ := net.SplitHostPort(address)
	reserved := -1
	if p == 0 {
		// A port of its own: dialers find a listener by its port's
		// number, so the number is held on TCP too (bound, not
		// listening: a TCP connect to it is refused), and no TCP
		// listener of this machine's loopback can take it meanwhile
		// and see its dialers sent here.
		if reserved, p, err = reservePort(); err != nil {
			return nil, opErr(err)
		}
	}
	ul, err := f.listenUnix(f.socketPath(p))
	if err != nil {
		if reserved >= 0 {
			unix.Close(reserved)
		}
		return nil, opErr(err)
	}
	return newListener(ul, Addr{net.JoinHostPort(host, strconv.Itoa(p))}, reserved), nil
}

// ListenName listens for shared-memory connections on a name rather
// than a port: processes that agree on a name (the ranks of a job, by
// its id and their rank) find each other with no port to pass around.
// A name is 1 to 80 letters, digits, '-', '_' and '.', not starting
// with "shm-" (the ports' names) or a dot; its socket sits in the
// factory's folder as the ports' do.
func (f *Factory) ListenName(name string) (net.Listener, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "listen", Net: "shm", Addr: Addr{name}, Err: err}
	}
	if err := checkName(name); err != nil {
		return nil, opErr(err)
	}
	if err := f.ownDir(); err != nil {
		return nil, opErr(err)
	}
	ul, err := f.listenUnix(f.namePath(name))
	if err != nil {
		return nil, opErr(err)
	}
	return newListener(ul, Addr{name}, -1), nil
}

// MaxName bounds a ListenName name, so that its socket's path fits a
// unix address (108 bytes) under a temporary folder of usual length.
const MaxName = 80

// ErrBadName is matched by the error for a name ListenName or
// DialName does not take.
var ErrBadName = errors.New("shm: a listener's name is 1 to 80 letters, digits, '-', '_' and '.', not starting with \"shm-\" or '.'")

func checkName(name string) error {
	if name == "" || len(name) > MaxName || name[0] == '.' || strings.HasPrefix(name, "shm-") {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%w: %q", ErrBadName, name)
		}
	}
	return nil
}

// RemoveName removes the socket of the listener on name, left behind
// by a process that ended without closing it; connections set up go
// on. A name with no socket is no error.
func (f *Factory) RemoveName(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := os.Remove(f.namePath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f *Factory) namePath(name string) string { return filepath.Join(f.dir, name+".sock") }

func newListener(ul *net.UnixListener, addr Addr, reserved int) *listener {
	l := &listener{ul: ul, addr: addr, reserved: reserved,
		conns: make(chan net.Conn), done: make(chan struct{}), pending: map[*net.UnixConn]struct{}{}}
	go l.accept()
	return l
}

// reservePort binds a TCP socket to a free port of 127.0.0.1 without
// listening, and returns it and the port.
func reservePort() (fd, port int, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	if err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err == nil {
		var sa unix.Sockaddr
		if sa, err = unix.Getsockname(fd); err == nil {
			return fd, sa.(*unix.SockaddrInet4).Port, nil
		}
	}
	unix.Close(fd)
	return -1, 0, err
}

// ownDir makes the sockets' folder, or checks the one there: it must be
// this user's and closed to others, or another user could listen in
// this user's name.
func (f *Factory) ownDir() error {
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(f.dir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("shm: %s must be a folder of user %d that no one else can enter (mode 700)", f.dir, os.Getuid())
	}
	return nil
}

// listenUnix listens on the socket at path, taking over a socket file
// that no process listens on (its process died).
func (f *Factory) listenUnix(path string) (*net.UnixListener, error) {
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if errors.Is(err, unix.EADDRINUSE) {
		if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
			c.Close()
			return nil, err
		} else if !errors.Is(derr, unix.ECONNREFUSED) {
			return nil, err
		}
		os.Remove(path)
		ul, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	if err != nil {
		return nil, err
	}
	os.Chmod(path, 0o600)
	return ul, nil
}

// listener accepts shared-memory connections: each set up in a
// goroutine of its own, bounded by the handshake timeout, so a slow or
// hostile dialer delays no other.
type listener struct {
	ul       *net.UnixListener
	reserved int // the TCP socket holding the port's number, or -1
	addr     Addr
	conns    chan net.Conn
	done     chan struct{}
	once     sync.Once

	mu      sync.Mutex
	pending map[*net.UnixConn]struct{} // in their set-up; closed with the listener
}

func (l *listener) accept() {
	for {
		c, err := l.ul.AcceptUnix()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.Close()
			return
		}
		l.mu.Lock()
		select {
		case <-l.done:
			l.mu.Unlock()
			c.Close()
			return
		default:
		}
		l.pending[c] = struct{}{}
		l.mu.Unlock()
		go func() {
			c.SetDeadline(time.Now().Add(layer.DefaultHandshakeTimeout))
			sc, err := acceptSetup(c, l.addr)
			l.mu.Lock()
			delete(l.pending, c)
			l.mu.Unlock()
			if err != nil {
				c.Close()
				return
			}
			select {
			case l.conns <- sc:
			case <-l.done:
				sc.Close()
			}
		}()
	}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "shm", Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops listening and removes the socket file; connections set
// up already go on.
func (l *listener) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		close(l.done)
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
		l.ul.Close() // removes the socket file
		if l.reserved >= 0 {
			unix.Close(l.reserved)
		}
	})
	return nil
}

func (l *listener) Addr() net.Addr { return l.addr }

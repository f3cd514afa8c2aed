package evloop

import (
	"container/heap"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/netconn"
)

// bufSize is the loop's copy buffer: one per loop, since each read is
// written out before the next.
const bufSize = 16 << 10

// acceptPause is how long the loop stops accepting after the system ran
// out of descriptors or memory, as net/http backs off.
const acceptPause = 100 * time.Millisecond

// ErrAborted is what Handler.Ended reports of a connection Loop.Abort
// reset.
var ErrAborted = errors.New("evloop: connection aborted")

// A Loop serves a listener's connections on one goroutine. It is a
// net.Listener whose Accept returns only the connections its Greeter
// handed off and Config.HandOff did not take: without them, it blocks
// until Close.
type Loop struct {
	cfg    Config
	h      Handler
	addr   net.Addr
	target unix.Sockaddr
	family int

	ep, wake int // the epoll set, and the eventfd that wakes it

	closing  atomic.Bool
	aborting atomic.Bool
	stop     sync.Once
	closed   chan struct{} // closed once the listening socket is
	done     chan struct{} // closed when the loop's goroutine is done

	mu     sync.Mutex
	exited bool                       // wake is closed
	bulk   map[*relayConn][2]net.Conn // the connections moved to netconn.Relay
	handed []net.Conn                 // handed off, for Accept; nil once closed
	queued chan struct{}              // signalled when handed grows

	// The loop's own, touched by its goroutine only.
	lfd        int // -1 once closed
	halves     map[int]*half
	greeting   []*relayConn // oldest first: with one GreetTimeout, by deadline
	connecting deadlines    // the connects with a deadline
	dialing    int          // the Greeter's connections connecting (Config.MaxConnecting)
	resume     time.Time    // when accepting resumes after a pause
	started    bool         // goroutines were started this round
	buf        [bufSize]byte
}

var _ net.Listener = (*Loop)(nil)

// relayConn is one accepted connection and its connection to Target.
type relayConn struct {
	Conn
	client, target half
	start          time.Time
	deadline       time.Time // of the greeting, then of the connect; zero: none
	reply          []byte    // the Greeting's, sent once connected
	greeting       bool      // waiting for its first bytes (Config.Greeter)
	connecting     bool
	dialing        bool // counted in Loop.dialing
	done           bool
}

// deadlines is a heap of connects by deadline. A connect that ended
// stays until it comes to the top.
type deadlines []*relayConn

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].deadline.Before(d[j].deadline) }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(*relayConn)) }
func (d *deadlines) Pop() any {
	old := *d
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*d = old[:len(old)-1]
	return c
}

// half is one socket of a relayConn. Bytes read from it go to peer.
type half struct {
	fd    int
	rc    *relayConn
	peer  *half
	count *int64 // the direction it feeds: Up for the client, Down for the target
	// carried is count for Conn.Carried, which other goroutines call.
	carried *atomic.Int64
	eof     bool // its read side reached the end of stream
	shut    bool // its write side was shut down: its peer was told of our end
}

// Listen serves l's connections on a new goroutine with cfg and h until
// Close.
// It takes the listening socket over: l is closed, and the port stays
// bound until Close. On an error l is left open.
func Listen(l *net.TCPListener, cfg Config, h Handler) (*Loop, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc, err := l.SyscallConn()
	if err != nil {
		return nil, err
	}
	lp := &Loop{cfg: cfg, h: h, addr: l.Addr(), lfd: -1, ep: -1, wake: -1,
		closed: make(chan struct{}), done: make(chan struct{}), queued: make(chan struct{}, 1),
		halves: map[int]*half{}, bulk: map[*relayConn][2]net.Conn{}}
	if lp.cfg.GreetTimeout == 0 {
		lp.cfg.GreetTimeout = DefaultGreetTimeout
	}
	var dupErr error
	if err := rc.Control(func(fd uintptr) {
		lp.lfd, dupErr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if dupErr != nil {
		return nil, os.NewSyscallError("fcntl", dupErr)
	}
	if err := lp.setup(); err != nil {
		lp.release() // l is left as it was
		return nil, err
	}
	l.Close() // the duplicate holds the socket
	go lp.run()
	return lp, nil
}

// setup makes the epoll set and the target's address.
func (lp *Loop) setup() error {
	if lp.cfg.Greeter == nil {
		lp.family, lp.target = sockaddr(lp.cfg.Target)
	}
	if err := unix.SetNonblock(lp.lfd, true); err != nil {
		return os.NewSyscallError("fcntl", err)
	}
	// Set once on the listening socket, these pass to every socket it
	// accepts: no system call per connection.
	setNoDelay(lp.lfd)
	keepAlive(lp.lfd, lp.cfg.KeepAlive)
	var err error
	if lp.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return os.NewSyscallError("epoll_create1", err)
	}
	if lp.wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return os.NewSyscallError("eventfd", err)
	}
	if err := lp.ctl(unix.EPOLL_CTL_ADD, lp.wake, unix.EPOLLIN); err != nil {
		return err
	}
	return lp.ctl(unix.EPOLL_CTL_ADD, lp.lfd, unix.EPOLLIN)
}

// release closes the loop's own descriptors.
func (lp *Loop) release() {
	for _, fd := range []int{lp.lfd, lp.ep} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	lp.mu.Lock()
	if lp.wake >= 0 {
		unix.Close(lp.wake)
	}
	lp.exited = true
	lp.mu.Unlock()
}

// sockaddr is t for connect(2), and its family.
func sockaddr(t netip.AddrPort) (int, unix.Sockaddr) {
	if a := t.Addr(); a.Is4() || a.Is4In6() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(t.Port()), Addr: a.Unmap().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(t.Port()), Addr: t.Addr().As16()}
}

// Accept returns the next connection the Greeter handed off (and
// Config.HandOff did not take), its first bytes unread, until the Loop
// is closed. Without a Greeter it blocks until then: the loop accepts by
// itself.
func (lp *Loop) Accept() (net.Conn, error) {
	for {
		lp.mu.Lock()
		if len(lp.handed) > 0 {
			c := lp.handed[0]
			lp.handed[0] = nil
			lp.handed = lp.handed[1:]
			lp.mu.Unlock()
			return c, nil
		}
		lp.mu.Unlock()
		select {
		case <-lp.queued:
		case <-lp.closed:
			return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: lp.addr, Err: net.ErrClosed}
		}
	}
}

// Addr is the listener's address.
func (lp *Loop) Addr() net.Addr { return lp.addr }

// Close stops accepting: the port is free when it returns. The
// connections in progress go on until they end or Abort. It must not be
// called from a Handler's method.
func (lp *Loop) Close() error {
	lp.stop.Do(func() {
		lp.closing.Store(true)
		lp.wakeUp()
		<-lp.closed
		// The loop hands off no more: reset those nobody took.
		lp.mu.Lock()
		handed := lp.handed
		lp.handed = nil
		lp.mu.Unlock()
		for _, c := range handed {
			netconn.Abort(c)
		}
	})
	return nil
}

// Abort resets every connection in progress, in the loop or moved to
// the splicing relay; each is reported to Ended with ErrAborted.
func (lp *Loop) Abort() {
	// The splicing relay's now, since the loop may have ended; the loop's
	// on its goroutine, which sweeps the splicing relay's again for one it
	// was moving meanwhile.
	lp.abortBulk()
	lp.aborting.Store(true)
	lp.wakeUp()
}

func (lp *Loop) abortBulk() {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	for c, cs := range lp.bulk {
		c.Aborted = true
		netconn.Abort(cs[0])
		netconn.Abort(cs[1])
	}
}

// Done is closed once the loop is closed and its last connection has
// left it (connections in the splicing relay may go on).
func (lp *Loop) Done() <-chan struct{} { return lp.done }

func (lp *Loop) wakeUp() {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if !lp.exited {
		var one = [8]byte{1}
		unix.Write(lp.wake, one[:])
	}
}

func (lp *Loop) ctl(op, fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := unix.EpollCtl(lp.ep, op, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// run is the loop. It ends once the Loop is closed and holds no
// connection. It blocks its thread in epoll_wait(2), as a goroutine in
// any blocking system call does. Not locked to the thread: the scheduler
// preempts a goroutine that never parks every 10 ms, and a locked one
// then costs two threads handing the P over (2.7x the futex calls per
// connection, measured).
func (lp *Loop) run() {
	defer close(lp.done)
	defer lp.release()
	events := make([]unix.EpollEvent, 128)
	for lp.lfd >= 0 || len(lp.halves) > 0 {
		n, err := unix.EpollWait(lp.ep, events, lp.timeout())
		if err != nil && err != unix.EINTR {
			// Not expected of a valid epoll set: give every connection
			// up rather than spin.
			lp.abortAll(os.NewSyscallError("epoll_wait", err))
			lp.closeListener()
			return
		}
		accept := false
		for _, ev := range events[:max(n, 0)] {
			switch fd := int(ev.Fd); {
			case fd == lp.wake:
				lp.woken()
			case fd == lp.lfd:
				accept = true
			default:
				if h := lp.halves[fd]; h != nil {
					lp.event(h)
				}
			}
		}
		lp.expire(time.Now())
		if accept && lp.lfd >= 0 {
			// Last: a socket it makes may reuse the number of one closed
			// above, whose events of this round must not reach it.
			lp.accept()
		}
		if lp.started {
			// The goroutines started this round (HandOff's, the splicing
			// relay's) wait on this P, which the loop's next
			// epoll_wait(2) would hold in a system call until another
			// thread is woken to take them: let them run first, as a
			// goroutine listener's Accept parks. Measured: a handed-off
			// connection's first byte 0.90x the excess without it.
			lp.started = false
			runtime.Gosched()
		}
	}
}

// timeout is epoll_wait's: until the next greeting or connect deadline
// or the end of an accept pause, in whole milliseconds rounded up; -1 for
// none.
func (lp *Loop) timeout() int {
	var next time.Time
	for len(lp.connecting) > 0 && !lp.connecting[0].connecting {
		heap.Pop(&lp.connecting)
	}
	for len(lp.greeting) > 0 && !lp.greeting[0].greeting {
		lp.greeting[0] = nil
		lp.greeting = lp.greeting[1:]
	}
	for _, t := range []time.Time{lp.resume, lp.connectBy(), lp.greetBy()} {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	if next.IsZero() {
		return -1
	}
	d := time.Until(next)
	if d <= 0 {
		return 0
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

func (lp *Loop) connectBy() time.Time {
	if len(lp.connecting) == 0 {
		return time.Time{}
	}
	return lp.connecting[0].deadline
}

func (lp *Loop) greetBy() time.Time {
	if len(lp.greeting) == 0 {
		return time.Time{}
	}
	return lp.greeting[0].deadline
}

// expire hands off the connections still silent at their greeting's
// deadline, fails the connects past theirs, and resumes accepting after
// a pause.
func (lp *Loop) expire(now time.Time) {
	for len(lp.greeting) > 0 {
		c := lp.greeting[0]
		if c.greeting && now.Before(c.deadline) {
			break
		}
		lp.greeting[0] = nil
		lp.greeting = lp.greeting[1:]
		if c.greeting {
			lp.handOff(c)
		}
	}
	for len(lp.connecting) > 0 {
		c := lp.connecting[0]
		if c.connecting && now.Before(c.deadline) {
			break
		}
		heap.Pop(&lp.connecting)
		if c.connecting {
			lp.dialFailed(c, os.ErrDeadlineExceeded)
		}
	}
	if !lp.resume.IsZero() && !now.Before(lp.resume) && lp.lfd >= 0 {
		lp.resume = time.Time{}
		lp.ctl(unix.EPOLL_CTL_MOD, lp.lfd, unix.EPOLLIN)
	}
}

// woken handles Close and Abort.
func (lp *Loop) woken() {
	var b [8]byte
	unix.Read(lp.wake, b[:])
	if lp.closing.Load() {
		lp.closeListener()
	}
	if lp.aborting.Swap(false) {
		lp.abortAll(ErrAborted)
	}
}

func (lp *Loop) closeListener() {
	if lp.lfd < 0 {
		return
	}
	unix.Close(lp.lfd) // leaves the epoll set with it
	lp.lfd = -1
	// Those still silent can no longer be handed off: as a listener's
	// Close closes the handshakes in progress.
	for _, c := range lp.greeting {
		if c.greeting {
			lp.forget(c)
			abortFd(c.client.fd)
		}
	}
	lp.greeting = nil
	close(lp.closed)
}

// abortAll resets every connection, the loop's and the splicing relay's.
func (lp *Loop) abortAll(err error) {
	seen := map[*relayConn]bool{}
	for _, h := range lp.halves {
		if c := h.rc; !seen[c] {
			seen[c] = true
			c.Aborted = err == ErrAborted
			if c.greeting {
				// Not yet the Handler's.
				lp.forget(c)
				abortFd(c.client.fd)
				continue
			}
			if c.connecting {
				lp.dialFailed(c, err)
				continue
			}
			lp.fail(c, err)
		}
	}
	lp.abortBulk()
}

// accept takes the connections waiting, a bounded number per event so
// the others get their turn.
func (lp *Loop) accept() {
	for range 64 {
		fd, sa, err := unix.Accept4(lp.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch err {
		case nil:
			lp.start(fd, sa)
			continue
		case unix.EAGAIN:
			return
		case unix.EINTR, unix.ECONNABORTED:
			continue
		}
		// Out of descriptors or memory (or the socket failed): try again
		// in a while, as the goroutine listeners' AcceptBackoff does.
		lp.resume = time.Now().Add(acceptPause)
		lp.ctl(unix.EPOLL_CTL_MOD, lp.lfd, 0)
		return
	}
}

// start connects an accepted connection on to Target, or with a
// Greeter, waits for its first bytes.
func (lp *Loop) start(fd int, sa unix.Sockaddr) {
	c := &relayConn{start: time.Now()}
	c.Remote = addrPort(sa)
	c.client = half{fd: fd, rc: c, peer: &c.target, count: &c.Up, carried: &c.up}
	c.target = half{fd: -1, rc: c, peer: &c.client, count: &c.Down, carried: &c.down}
	if lp.cfg.Greeter != nil {
		if err := lp.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN); err != nil {
			abortFd(fd)
			return
		}
		lp.halves[fd] = &c.client
		c.greeting = true
		c.deadline = c.start.Add(lp.cfg.GreetTimeout)
		lp.greeting = append(lp.greeting, c)
		return
	}
	if !lp.h.Accepted(&c.Conn) {
		abortFd(fd)
		return
	}
	c.Target = lp.cfg.Target
	lp.connect(c, lp.family, lp.target, time.Time{})
}

// greet shows the Greeter the first bytes of c, and connects it on as the
// Greeting says, or hands it off.
func (lp *Loop) greet(c *relayConn) {
	if m := lp.cfg.MaxConnecting; m > 0 && lp.dialing >= m {
		lp.handOff(c)
		return
	}
	n, _, err := unix.Recvfrom(c.client.fd, lp.buf[:MaxGreeting], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return
	case err != nil || n == 0:
		// An end or a failure before any byte: the long way says
		// what of.
		lp.handOff(c)
		return
	}
	g, ok := lp.cfg.Greeter.Greet(&c.Conn, lp.buf[:n])
	if !ok {
		lp.handOff(c)
		return
	}
	c.greeting = false
	if g.Consume < 0 || g.Consume > n || !g.Target.IsValid() {
		lp.forget(c)
		abortFd(c.client.fd)
		return
	}
	if !lp.h.Accepted(&c.Conn) {
		lp.forget(c)
		abortFd(c.client.fd)
		return
	}
	c.dialing = true
	lp.dialing++
	c.Target, c.reply = g.Target, g.Reply
	// The greeting's bytes were peeked: they are all there to read.
	if g.Consume > 0 {
		if m, err := unix.Read(c.client.fd, lp.buf[:g.Consume]); m != g.Consume {
			if err == nil {
				err = unix.EIO
			}
			lp.dialFailed(c, os.NewSyscallError("read", err))
			return
		}
	}
	if g.Control != nil {
		if err := g.Control(rawFD(c.client.fd)); err != nil {
			lp.dialFailed(c, err)
			return
		}
	}
	// While the connect is in progress, only the client's hang-up
	// matters: what it sends waits in its socket.
	if err := lp.ctl(unix.EPOLL_CTL_MOD, c.client.fd, unix.EPOLLRDHUP); err != nil {
		lp.dialFailed(c, err)
		return
	}
	family, sa := sockaddr(g.Target)
	lp.connect(c, family, sa, g.Deadline)
}

// handOff gives c, its bytes unread, to Accept; after Close, it resets
// it.
func (lp *Loop) handOff(c *relayConn) {
	lp.forget(c)
	c.greeting = false
	unix.EpollCtl(lp.ep, unix.EPOLL_CTL_DEL, c.client.fd, nil)
	if lp.lfd < 0 {
		abortFd(c.client.fd)
		return
	}
	nc, err := fileConn(c.client.fd)
	if err != nil {
		return // fileConn closed it
	}
	if h := lp.cfg.HandOff; h != nil && h(nc) {
		lp.started = true
		return
	}
	lp.mu.Lock()
	lp.handed = append(lp.handed, nc)
	lp.mu.Unlock()
	select {
	case lp.queued <- struct{}{}:
	default:
	}
}

// connect starts the connect of c to sa, of the given family, which
// fails at deadline, or after DialTimeout if it is zero.
func (lp *Loop) connect(c *relayConn, family int, sa unix.Sockaddr, deadline time.Time) {
	tfd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		lp.dialFailed(c, os.NewSyscallError("socket", err))
		return
	}
	c.target.fd = tfd
	if ctl := lp.cfg.DialControl; ctl != nil {
		if err := ctl(rawFD(tfd)); err != nil {
			lp.dialFailed(c, err)
			return
		}
	} else {
		setNoDelay(tfd)
		keepAlive(tfd, defaultKeepAlive)
	}
	for {
		err = unix.Connect(tfd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil && err != unix.EINPROGRESS {
		lp.dialFailed(c, os.NewSyscallError("connect", err))
		return
	}
	if err := lp.ctl(unix.EPOLL_CTL_ADD, tfd, unix.EPOLLOUT); err != nil {
		lp.dialFailed(c, err)
		return
	}
	lp.halves[tfd] = &c.target
	c.connecting = true
	if d := lp.cfg.DialTimeout; d > 0 && deadline.IsZero() {
		deadline = c.start.Add(d)
	}
	if c.deadline = deadline; !deadline.IsZero() {
		heap.Push(&lp.connecting, c)
	}
}

// dialFailed reports a connect that failed and resets the client, or,
// with a Greeter, sends it the Greeter's refusal and closes it.
func (lp *Loop) dialFailed(c *relayConn, err error) {
	if c.target.fd >= 0 {
		delete(lp.halves, c.target.fd)
		unix.Close(c.target.fd)
		c.target.fd = -1
	}
	c.done, c.connecting = true, false
	lp.settled(c)
	delete(lp.halves, c.client.fd) // a Greeter's connections are watched while connecting
	err = &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(c.Target), Err: err}
	var refusal []byte
	if g := lp.cfg.Greeter; g != nil && !errors.Is(err, ErrClientLeft) && !errors.Is(err, ErrAborted) {
		refusal = g.Refusal(&c.Conn, err)
	}
	if w, _ := unix.Write(c.client.fd, refusal); len(refusal) > 0 && w == len(refusal) {
		unix.Close(c.client.fd)
	} else {
		abortFd(c.client.fd)
	}
	lp.h.Dialed(&c.Conn, time.Since(c.start), err)
}

// halfClosed reports whether the client, whose end woke the loop while
// its connect is in progress, half-closed after a request (bytes wait
// unread after its greeting) rather than gave up: the relay passes its
// end on once connected, and until then only a reset wakes the loop for
// it (epoll is level-triggered: the end would wake it again and again).
// As vlink.Listener's handshake does, an end with nothing unread is taken
// for a dialer that left.
func (lp *Loop) halfClosed(c *relayConn) bool {
	pfd := []unix.PollFd{{Fd: int32(c.client.fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 0); err != nil || n != 1 || pfd[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
		return false // reset (the bytes it sent are lost to it anyway)
	}
	if n, _, err := unix.Recvfrom(c.client.fd, lp.buf[:1], unix.MSG_PEEK|unix.MSG_DONTWAIT); err != nil || n == 0 {
		return false
	}
	// Errors and hang-ups are reported whatever the events asked for.
	return lp.ctl(unix.EPOLL_CTL_MOD, c.client.fd, 0) == nil
}

// settled takes c, whose connect ended, off the count of the Greeter's
// connects in progress.
func (lp *Loop) settled(c *relayConn) {
	if c.dialing {
		c.dialing = false
		lp.dialing--
	}
}

// connected starts relaying once the connect completed.
func (lp *Loop) connected(c *relayConn) {
	c.connecting = false
	lp.settled(c)
	soErr, err := unix.GetsockoptInt(c.target.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && soErr != 0 {
		err = unix.Errno(soErr)
	}
	if err != nil {
		lp.dialFailed(c, os.NewSyscallError("connect", err))
		return
	}
	lp.h.Dialed(&c.Conn, time.Since(c.start), nil)
	if len(c.reply) > 0 {
		// A fresh socket takes a greeting's few bytes at once.
		if w, err := unix.Write(c.client.fd, c.reply); w != len(c.reply) {
			if err == nil || err == unix.EAGAIN {
				err = unix.ENOBUFS
			}
			lp.fail(c, lp.opError(&c.client, "write", err))
			return
		}
		c.reply = nil
	}
	if err := lp.ctl(unix.EPOLL_CTL_MOD, c.target.fd, unix.EPOLLIN); err != nil {
		lp.fail(c, err)
		return
	}
	op := unix.EPOLL_CTL_ADD
	if _, watched := lp.halves[c.client.fd]; watched {
		op = unix.EPOLL_CTL_MOD // a Greeter's: watched for a hang-up meanwhile
	}
	lp.halves[c.client.fd] = &c.client
	if err := lp.ctl(op, c.client.fd, unix.EPOLLIN); err != nil {
		lp.fail(c, err)
	}
}

// event handles what epoll reported of h.
func (lp *Loop) event(h *half) {
	c := h.rc
	switch {
	case c.greeting:
		lp.greet(c)
		return
	case c.connecting && h == &c.client:
		if !lp.halfClosed(c) {
			lp.dialFailed(c, ErrClientLeft)
		}
		return
	case c.connecting:
		lp.connected(c)
		return
	}
	if h.eof {
		// Its read side is done, so only an error or a hang-up wakes it:
		// its peer reset the connection while we still had to send.
		lp.fail(c, lp.sockError(h, "read"))
		return
	}
	n, err := unix.Read(h.fd, lp.buf[:])
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		return
	case err != nil:
		lp.fail(c, lp.opError(h, "read", err))
		return
	case n == 0:
		lp.ended(h)
		return
	}
	w, err := unix.Write(h.peer.fd, lp.buf[:n])
	if err == unix.EAGAIN {
		w, err = 0, nil
	}
	if err != nil {
		lp.fail(c, lp.opError(h.peer, "write", err))
		return
	}
	*h.count += int64(w)
	h.carried.Add(int64(w))
	if w < n || *h.count > BulkBytes {
		lp.moveToRelay(c, h, lp.buf[w:n])
	}
}

// ended passes the end of h's stream on to its peer, and closes the
// connection once both ways ended.
func (lp *Loop) ended(h *half) {
	c := h.rc
	if !h.shut && tcpState(h.fd) == tcpStateClose {
		// A reset the kernel reported to an earlier write as EPIPE, and
		// to this read as an end of stream (netconn.Relay's hiddenReset):
		// passing on a FIN would make a cut stream look whole.
		lp.fail(c, lp.opError(h, "read", unix.ECONNRESET))
		return
	}
	h.eof = true
	h.peer.shut = true
	err := unix.Shutdown(h.peer.fd, unix.SHUT_WR)
	switch {
	case h.peer.eof:
		// Both ways ended; a reset by the peer after its own end is no
		// failure (netconn.Relay).
		lp.finish(c)
	case err != nil && !netconn.ResetByPeer(err):
		lp.fail(c, lp.opError(h.peer, "shutdown", err))
	default:
		// A reset by the peer says nothing yet: the read it wakes tells
		// whether it came after the peer's own end. Meanwhile h, whose
		// readiness stays, must not wake the loop.
		if err := lp.ctl(unix.EPOLL_CTL_MOD, h.fd, 0); err != nil {
			lp.fail(c, err)
		}
	}
}

// fail resets both connections and reports err.
func (lp *Loop) fail(c *relayConn, err error) {
	if c.done {
		return
	}
	lp.forget(c)
	abortFd(c.client.fd)
	abortFd(c.target.fd)
	lp.h.Ended(&c.Conn, err)
}

// finish closes both connections after both ways ended.
func (lp *Loop) finish(c *relayConn) {
	lp.forget(c)
	unix.Close(c.client.fd)
	unix.Close(c.target.fd)
	lp.h.Ended(&c.Conn, nil)
}

func (lp *Loop) forget(c *relayConn) {
	c.done = true
	delete(lp.halves, c.client.fd)
	delete(lp.halves, c.target.fd)
}

// moveToRelay hands c to netconn.Relay on goroutines of their own, with
// pending, read from src but not yet written, to go first.
func (lp *Loop) moveToRelay(c *relayConn, src *half, pending []byte) {
	lp.forget(c)
	for _, fd := range []int{c.client.fd, c.target.fd} {
		unix.EpollCtl(lp.ep, unix.EPOLL_CTL_DEL, fd, nil)
	}
	client, cerr := fileConn(c.client.fd)
	target, terr := fileConn(c.target.fd)
	if err := errors.Join(cerr, terr); err != nil {
		for _, nc := range []net.Conn{client, target} {
			if nc != nil {
				netconn.Abort(nc)
			}
		}
		lp.h.Ended(&c.Conn, err)
		return
	}
	if src == &c.client {
		client = netconn.Prefixed(client, pending)
	} else {
		target = netconn.Prefixed(target, pending)
	}
	if tc, ok := client.(*net.TCPConn); ok {
		c.moved.Store(tc)
	}
	lp.mu.Lock()
	lp.bulk[c] = [2]net.Conn{client, target}
	lp.mu.Unlock()
	lp.started = true
	go func() {
		up, down, err := netconn.Relay(client, target)
		lp.mu.Lock()
		delete(lp.bulk, c)
		if c.Aborted {
			err = ErrAborted // not the net.ErrClosed Relay met
		}
		lp.mu.Unlock()
		c.Up += up
		c.Down += down
		lp.h.Ended(&c.Conn, err)
	}()
}

// rawFD is a socket the loop owns as a syscall.RawConn, for
// Config.DialControl: Control runs f on it, Read and Write are not for
// the loop's sockets.
type rawFD int

func (fd rawFD) Control(f func(fd uintptr)) error { f(uintptr(fd)); return nil }
func (rawFD) Read(func(fd uintptr) bool) error    { return ErrUnsupported }
func (rawFD) Write(func(fd uintptr) bool) error   { return ErrUnsupported }

// fileConn makes a net.Conn of fd, which it closes.
func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	return net.FileConn(f)
}

// sockError returns the socket's pending error, as a read would have.
func (lp *Loop) sockError(h *half, op string) error {
	soErr, err := unix.GetsockoptInt(h.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil {
		err = unix.ECONNRESET // a hang-up without an error: reset all the same
		if soErr != 0 {
			err = unix.Errno(soErr)
		}
	}
	return lp.opError(h, op, err)
}

// opError names the hop as the net package does: the client's address,
// or Target.
func (lp *Loop) opError(h *half, op string, errno error) error {
	addr := net.TCPAddrFromAddrPort(h.rc.Target)
	if h == &h.rc.client {
		addr = net.TCPAddrFromAddrPort(h.rc.Remote)
	}
	return &net.OpError{Op: op, Net: "tcp", Addr: addr, Err: os.NewSyscallError(op, errno)}
}

// defaultKeepAlive is what the net package's zero Dialer and
// ListenConfig set.
var defaultKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second, Count: 9}

// keepAlive sets fd's keep-alives as ka says, its zero value meaning the
// net package's default. On a listening socket they pass to the sockets
// it accepts.
func keepAlive(fd int, ka net.KeepAliveConfig) {
	if ka == (net.KeepAliveConfig{}) {
		ka = defaultKeepAlive
	}
	if !ka.Enable || ka.Idle < 0 {
		return
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	if ka.Idle > 0 {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, secs(ka.Idle))
	}
	if ka.Interval > 0 {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, secs(ka.Interval))
	}
	if ka.Count > 0 {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT, ka.Count)
	}
}

func secs(d time.Duration) int { return int((d + time.Second - 1) / time.Second) }

func setNoDelay(fd int) { unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) }

// abortFd closes fd with a reset (SO_LINGER 0), as netconn.Abort does.
func abortFd(fd int) {
	if fd < 0 {
		return
	}
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
}

// tcpStateClose is the kernel's TCP_CLOSE (include/net/tcp_states.h).
const tcpStateClose = 7

func tcpState(fd int) uint8 {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0
	}
	return info.State
}

func addrPort(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// String names the loop in logs.
func (lp *Loop) String() string {
	if lp.cfg.Greeter != nil {
		return fmt.Sprintf("evloop %s -> greeted", lp.addr)
	}
	return fmt.Sprintf("evloop %s -> %s", lp.addr, lp.cfg.Target)
}

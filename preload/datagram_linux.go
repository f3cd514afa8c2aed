package preload

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn/dgram"
	"github.com/vlink-dev/vlink/selector"
)

// Datagrams. A program's UDP socket that connects to a routed destination
// is connected instead to a relay socket of the agent's on loopback (the
// shim asks with msgDatagram and gets the relay's port). The relay socket
// is itself connected to the program's, so the kernel takes no datagram
// from any other. Each datagram the program sends there goes whole into a
// datagram session (vlink.Dialer.Dial with network "udp") to the
// destination, dialed at the first datagram, and each one the session
// brings back goes to the program from the relay socket, whose address the
// shim shows the program as the destination's (recvfrom, recvmsg,
// getpeername).
//
// The relay socket lives as long as the program's: it ends when a datagram
// it sends back bounces (ECONNREFUSED: the program closed its socket),
// when the agent needs room for another (the longest idle goes), or with
// the agent. The session closes when no datagram crossed either way for
// datagramIdle, as a NAT forgets a mapping; the next datagram opens another.
//
// A refusal, from the far side's socket (its ICMP port unreachable, which
// the session carries) or of the session itself (a gateway that does not
// forward the destination's datagrams), turns the relay socket away from
// the program's for refusedPause: it is connected to itself, and the
// kernel answers the program's datagrams with a port unreachable, so that
// the program gets ECONNREFUSED as its own socket would have. The
// datagram that found the refusal is lost: the program learns one
// datagram later than without the shim. The pause outlasts the usual
// retry of a UDP client (5 s for DNS); the first datagram after it is
// carried again.
const (
	datagramIdle      = 2 * time.Minute
	maxDatagramRelays = 1024
	refusedPause      = 10 * time.Second
)

// A dgramRelay carries one program socket's datagrams.
type dgramRelay struct {
	a      *Agent
	d      decision
	target string
	attrs  []any
	laddr  *net.UDPAddr // the relay socket's own address, kept across a refusal
	prog   *net.UDPAddr // the program's socket, the only peer

	used atomic.Bool // a datagram crossed since the last idle check

	sock *net.UDPConn // connected to prog, or to itself while refused

	mu      sync.Mutex
	sess    net.Conn // nil while none is open
	closed  bool
	refused bool
	idle    *time.Timer
	back    sync.WaitGroup // the session readers
}

// datagram answers a msgDatagram: direct or refused by the rules, or a
// relay socket for the program's to connect to.
func (a *Agent) datagram(pid int, req *datagramReq) result {
	d, target, attrs, answer := a.verdict(pid, req.dest)
	if answer != nil {
		return *answer
	}
	if d.rule.Action == selector.BestEffort {
		// Each datagram would need its own race of the ways: none is run.
		a.observed(ConnectFailed)
		a.log.Info("cannot carry datagrams over a best-effort route", attrs...)
		return result{kind: resultError, errno: uint16(syscall.ENETUNREACH)}
	}
	network, lo := "udp4", netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if req.family == 6 {
		network, lo = "udp6", netip.IPv6Loopback()
	}
	prog := net.UDPAddrFromAddrPort(req.local)
	sock, err := net.DialUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)), prog)
	if err != nil {
		a.log.Info("cannot open a datagram relay", append(attrs, "err", err)...)
		return result{kind: resultError, errno: uint16(syscall.ENETUNREACH)}
	}
	r := &dgramRelay{a: a, d: d, target: target, attrs: attrs, laddr: sock.LocalAddr().(*net.UDPAddr), prog: prog, sock: sock}
	r.idle = time.AfterFunc(datagramIdle, r.checkIdle)
	if err := a.addDatagram(r); err != nil {
		r.idle.Stop()
		sock.Close()
		a.log.Info("cannot open a datagram relay", append(attrs, "err", err)...)
		return result{kind: resultError, errno: uint16(syscall.ENOBUFS)}
	}
	a.observed(ConnectRouted)
	a.log.Debug("datagram relay", append(attrs, "relay", r.laddr.String())...)
	a.wg.Add(1)
	go r.run()
	return result{kind: resultDatagram, token: uint64(r.laddr.Port)}
}

// addDatagram registers r. At maxDatagramRelays it makes room by closing
// a relay with no session open (none crossed it for datagramIdle at
// least: its program's socket may well be gone), and fails if every one
// has a session.
func (a *Agent) addDatagram(r *dgramRelay) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return net.ErrClosed
	}
	if len(a.dgrams) >= maxDatagramRelays {
		var victim *dgramRelay
		for o := range a.dgrams {
			if !o.open() {
				victim = o
				break
			}
		}
		if victim == nil {
			return fmt.Errorf("%d relays, each with a session open", maxDatagramRelays)
		}
		delete(a.dgrams, victim)
		go victim.Close()
	}
	a.dgrams[r] = struct{}{}
	a.conns[r] = struct{}{}
	return nil
}

func (a *Agent) dropDatagram(r *dgramRelay) {
	a.mu.Lock()
	delete(a.dgrams, r)
	delete(a.conns, r)
	a.mu.Unlock()
}

// touch records that a datagram crossed: a load, not a store, on the hot
// path.
func (r *dgramRelay) touch() {
	if !r.used.Load() {
		r.used.Store(true)
	}
}

// open reports whether r has a session open.
func (r *dgramRelay) open() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sess != nil
}

// Close ends the relay: its socket, its session, and run.
func (r *dgramRelay) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.idle.Stop()
	r.sock.Close()
	if r.sess != nil {
		r.sess.Close()
	}
	return nil
}

// run carries the program's datagrams to the session until the relay
// ends.
func (r *dgramRelay) run() {
	defer r.a.wg.Done()
	defer r.back.Wait()
	defer r.a.dropDatagram(r)
	defer r.Close()
	buf := make([]byte, dgram.MaxDatagram)
	for {
		n, err := r.sock.Read(buf)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) && r.isRefused() {
				continue // a datagram sent to the program before the refusal bounced
			}
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNREFUSED) {
				r.a.log.Debug("datagram relay", append(r.attrs, "err", err)...)
			}
			return // the agent's end, or a reply bounced: the program's socket is gone
		}
		if r.isRefused() {
			continue // not the program's
		}
		r.touch()
		sess, err := r.session()
		if err != nil {
			r.a.log.Info("cannot carry datagrams", append(r.attrs, "err", err)...)
			r.refuse()
			continue
		}
		if _, err := sess.Write(buf[:n]); err != nil {
			r.endSession(sess)
		}
	}
}

func (r *dgramRelay) isRefused() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

// session returns the open session, dialing one if none is.
func (r *dgramRelay) session() (net.Conn, error) {
	r.mu.Lock()
	sess := r.sess
	r.mu.Unlock()
	if sess != nil {
		return sess, nil
	}
	ctx, cancel := context.WithTimeout(r.a.ctx, r.a.timeout)
	defer cancel()
	var err error
	if r.d.rule.Action == selector.Direct {
		// A far-side name whose rule says direct: the agent resolves it.
		sess, err = r.a.direct.DialContext(ctx, "udp", r.target)
	} else {
		sess, err = r.a.stacks.DialContext(ctx, "udp", r.target)
	}
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		sess.Close()
		return nil, net.ErrClosed
	}
	r.sess = sess
	r.back.Add(1)
	go r.carryBack(sess)
	return sess, nil
}

// carryBack carries the session's datagrams to the program until the
// session ends.
func (r *dgramRelay) carryBack(sess net.Conn) {
	defer r.back.Done()
	defer r.endSession(sess)
	buf := make([]byte, dgram.MaxDatagram)
	for {
		n, err := sess.Read(buf)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) && (errno == syscall.ECONNREFUSED || errno == syscall.EHOSTUNREACH || errno == syscall.ENETUNREACH) {
				r.a.log.Debug("the far side's socket refused a datagram", append(r.attrs, "err", err)...)
				r.refuse()
				continue
			}
			return
		}
		r.touch()
		r.mu.Lock()
		refused := r.refused
		if !refused {
			// Under the lock: refuse must not turn the socket away
			// between the check and the write.
			_, err = r.sock.Write(buf[:n])
		}
		r.mu.Unlock()
		if err != nil {
			r.Close() // the program's socket is gone
			return
		}
	}
}

// endSession closes sess if it is still the relay's.
func (r *dgramRelay) endSession(sess net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sess == sess {
		r.sess = nil
	}
	sess.Close()
}

// refuse turns the relay socket away from the program's for refusedPause
// (see datagramIdle).
func (r *dgramRelay) refuse() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.refused {
		return
	}
	if err := r.connect(r.laddr); err != nil {
		r.a.log.Debug("datagram relay", append(r.attrs, "err", err)...)
		return
	}
	r.refused = true
	time.AfterFunc(refusedPause, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed {
			return
		}
		if err := r.connect(r.prog); err != nil {
			r.a.log.Debug("datagram relay", append(r.attrs, "err", err)...)
			return
		}
		r.refused = false
	})
}

// connect connects the relay socket to a: a connected UDP socket takes
// datagrams from its peer alone, and the kernel answers others with a
// port unreachable, as if nothing listened.
func (r *dgramRelay) connect(a *net.UDPAddr) error {
	rc, err := r.sock.SyscallConn()
	if err != nil {
		return err
	}
	var sa syscall.Sockaddr
	if ip4 := a.IP.To4(); ip4 != nil && r.laddr.IP.To4() != nil {
		sa = &syscall.SockaddrInet4{Port: a.Port, Addr: [4]byte(ip4)}
	} else {
		sa = &syscall.SockaddrInet6{Port: a.Port, Addr: [16]byte(a.IP.To16())}
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = syscall.Connect(int(fd), sa) }); err != nil {
		return err
	}
	return cerr
}

// checkIdle closes the session when no datagram crossed since the last
// check.
func (r *dgramRelay) checkIdle() {
	if !r.used.Swap(false) {
		r.mu.Lock()
		sess := r.sess
		r.sess = nil
		r.mu.Unlock()
		if sess != nil {
			sess.Close()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.idle.Reset(datagramIdle)
	}
}

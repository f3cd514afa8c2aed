package socks

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txthinking/socks5"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/netconn/dgram"
)

// UDPConfig makes a Server serve SOCKS5 UDP ASSOCIATE (RFC 1928 §7). The
// zero value holds the defaults.
type UDPConfig struct {
	// MaxDests bounds the destinations one association sends to at once,
	// each a datagram session of the Dialer's: a datagram to one more is
	// dropped until another falls idle. Zero (or less) means 64.
	MaxDests int
	// Idle ends a destination's session after no datagram crossed it
	// either way for this long, as a NAT forgets a mapping. Zero (or
	// less) means two minutes.
	Idle time.Duration
	// Logger, if set, gets one line per destination session that could
	// not start, and a summary of what was dropped when an association
	// ends.
	Logger *slog.Logger
}

const (
	defaultMaxDests = 64
	defaultUDPIdle  = 2 * time.Minute
	destQueue       = 64 // datagrams waiting for a destination's session
)

// An Association is a client's UDP ASSOCIATE: a UDP socket, bound on the
// address the client reached the server on, that relays the client's
// datagrams to the destinations their headers name and the answers back,
// each wrapped in the same header. It serves the client that asked only:
// datagrams from any other address are dropped, and the association ends
// with the TCP connection it was asked on.
type Association struct {
	pc     *net.UDPConn
	client netip.Addr // the control connection's peer address
	port   atomic.Uint32
	dial   func(ctx context.Context, network, address string) (net.Conn, error)
	cfg    UDPConfig

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	dests  map[string]*assocDest
	wg     sync.WaitGroup

	dropped struct {
		foreign, fragments, malformed, full atomic.Int64
	}
}

// associate opens the association of a UDP ASSOCIATE request that came on
// c and asked for clientPort (0: the first datagram's).
func (s *Server) associate(c net.Conn, clientPort uint16) (*Association, error) {
	local, ok1 := c.LocalAddr().(*net.TCPAddr)
	remote, ok2 := c.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("socks: UDP ASSOCIATE over %T: want a TCP connection", c.LocalAddr())
	}
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: local.IP, Zone: local.Zone})
	if err != nil {
		return nil, err
	}
	netconn.SetUDPBuffers(pc, dgram.SocketBuffer/4)
	cfg := *s.UDP
	if cfg.MaxDests <= 0 {
		cfg.MaxDests = defaultMaxDests
	}
	if cfg.Idle <= 0 {
		cfg.Idle = defaultUDPIdle
	}
	a := &Association{pc: pc, client: remote.AddrPort().Addr().Unmap(), dial: s.Dialer.DialContext, cfg: cfg,
		dests: map[string]*assocDest{}}
	a.port.Store(uint32(clientPort))
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a, nil
}

// Addr is the address the client sends its datagrams to.
func (a *Association) Addr() *net.UDPAddr { return a.pc.LocalAddr().(*net.UDPAddr) }

// Serve relays datagrams until control, the connection the association
// was asked on, ends (or ctx does), then closes everything it opened.
func (a *Association) Serve(ctx context.Context, control net.Conn) {
	stop := context.AfterFunc(ctx, func() { a.pc.Close() })
	defer stop()
	go func() {
		// The client sends nothing more on the control connection; its
		// end is the association's.
		io.Copy(io.Discard, control)
		a.pc.Close()
	}()
	buf := make([]byte, dgram.MaxDatagram)
	for {
		n, from, err := a.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			break // closed: the control connection or ctx ended
		}
		a.receive(from, buf[:n])
	}
	a.cancel()
	a.mu.Lock()
	dests := a.dests
	a.dests = nil
	a.mu.Unlock()
	for _, d := range dests {
		d.Close()
	}
	a.wg.Wait()
	if l := a.cfg.Logger; l != nil {
		if f, g, m, q := a.dropped.foreign.Load(), a.dropped.fragments.Load(), a.dropped.malformed.Load(), a.dropped.full.Load(); f+g+m+q > 0 {
			l.Info("UDP association ended with datagrams dropped", "client", a.client.String(),
				"from_others", f, "fragments", g, "malformed", m, "queue_full", q)
		}
	}
}

// receive takes one datagram the association's socket read.
func (a *Association) receive(from netip.AddrPort, b []byte) {
	if from.Addr().Unmap() != a.client {
		a.dropped.foreign.Add(1) // bound to the client that asked
		return
	}
	if p := a.port.Load(); p == 0 {
		a.port.CompareAndSwap(0, uint32(from.Port()))
	} else if uint16(p) != from.Port() {
		a.dropped.foreign.Add(1)
		return
	}
	d, err := socks5.NewDatagramFromBytes(b)
	if err != nil {
		a.dropped.malformed.Add(1)
		return
	}
	if d.Frag != 0 {
		// RFC 1928 §7: a server that does not reassemble drops them.
		a.dropped.fragments.Add(1)
		return
	}
	if d.Rsv[0] != 0 || d.Rsv[1] != 0 {
		a.dropped.malformed.Add(1)
		return
	}
	dest, err := destOf(d)
	if err != nil {
		a.dropped.malformed.Add(1)
		return
	}
	a.mu.Lock()
	ad := a.dests[dest]
	if ad == nil {
		if a.dests == nil || len(a.dests) >= a.cfg.MaxDests {
			a.mu.Unlock()
			a.dropped.full.Add(1)
			return
		}
		ad = a.startDest(dest, d)
	}
	a.mu.Unlock()
	select {
	case ad.q <- append([]byte(nil), d.Data...):
	default:
		a.dropped.full.Add(1)
	}
}

// destOf returns the destination a datagram's header names, as a dial
// takes it: a name is left for the far side to resolve.
func destOf(d *socks5.Datagram) (string, error) {
	port := strconv.Itoa(int(binary.BigEndian.Uint16(d.DstPort)))
	if d.Atyp == socks5.ATYPDomain {
		name := string(d.DstAddr[1:])
		if err := checkName(name); err != nil {
			return "", err
		}
		return net.JoinHostPort(name, port), nil
	}
	ip, ok := netip.AddrFromSlice(d.DstAddr)
	if !ok {
		return "", errors.New("bad address")
	}
	return net.JoinHostPort(ip.Unmap().String(), port), nil
}

// startDest starts the session of a new destination. a.mu is held.
func (a *Association) startDest(dest string, first *socks5.Datagram) *assocDest {
	ad := &assocDest{a: a, dest: dest, q: make(chan []byte, destQueue), done: make(chan struct{})}
	// Answers carry the destination as the client named it.
	ad.header = (&socks5.Datagram{Rsv: []byte{0, 0}, Frag: 0, Atyp: first.Atyp, DstAddr: first.DstAddr, DstPort: first.DstPort}).Bytes()
	a.dests[dest] = ad
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		ad.run()
	}()
	return ad
}

// An assocDest is one destination of an association: the client's side of
// its relay, a net.Conn whose Read returns the client's datagrams for the
// destination and whose Write sends the client an answer, with its header.
type assocDest struct {
	a      *Association
	dest   string
	header []byte
	q      chan []byte
	rd     netconn.Deadline
	done   chan struct{}
	once   sync.Once
}

// run dials the destination and relays until the session falls idle or
// fails, or the association ends.
func (d *assocDest) run() {
	defer d.Close()
	ctx, cancel := context.WithTimeout(d.a.ctx, 30*time.Second)
	out, err := d.a.dial(ctx, "udp", d.dest)
	cancel()
	if err != nil {
		if l := d.a.cfg.Logger; l != nil && d.a.ctx.Err() == nil {
			l.Info("UDP association: cannot reach destination", "client", d.a.client.String(), "dest", d.dest, "err", err)
		}
		// Dropped for a second, so a refusing route is not asked again
		// for each datagram.
		select {
		case <-time.After(time.Second):
		case <-d.a.ctx.Done():
		}
		return
	}
	defer out.Close()
	dgram.Relay(d, out, d.a.cfg.Idle)
}

func (d *assocDest) Read(b []byte) (int, error) {
	select {
	case <-d.done:
		return 0, net.ErrClosed
	default:
	}
	if d.rd.Exceeded() {
		return 0, os.ErrDeadlineExceeded
	}
	select {
	case m := <-d.q:
		return copy(b, m), nil
	case <-d.done:
		return 0, net.ErrClosed
	case <-d.rd.Done():
		return 0, os.ErrDeadlineExceeded
	}
}

func (d *assocDest) Write(b []byte) (int, error) {
	port := d.a.port.Load()
	if port == 0 {
		return len(b), nil // no datagram came yet: nowhere to answer
	}
	to := netip.AddrPortFrom(d.a.client, uint16(port))
	msg := append(append(make([]byte, 0, len(d.header)+len(b)), d.header...), b...)
	if _, err := d.a.pc.WriteToUDPAddrPort(msg, to); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Close ends the destination's session: the next datagram for it starts
// a new one.
func (d *assocDest) Close() error {
	d.once.Do(func() {
		close(d.done)
		d.a.mu.Lock()
		if d.a.dests[d.dest] == d {
			delete(d.a.dests, d.dest)
		}
		d.a.mu.Unlock()
	})
	return nil
}

func (d *assocDest) LocalAddr() net.Addr { return d.a.pc.LocalAddr() }
func (d *assocDest) RemoteAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(d.a.client, uint16(d.a.port.Load())))
}
func (d *assocDest) SetDeadline(t time.Time) error      { d.rd.Set(t); return nil }
func (d *assocDest) SetReadDeadline(t time.Time) error  { d.rd.Set(t); return nil }
func (d *assocDest) SetWriteDeadline(t time.Time) error { return nil }

package quic

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

const (
	// openTimeout bounds how long an accepted stream may take to send
	// its first byte.
	openTimeout = 10 * time.Second
	// drainTime, plus a few round trips, is how long a closed
	// listener's path outlives its last stream at least.
	drainTime = time.Second
	// MaxListenerPaths bounds the QUIC connections one listener keeps
	// (each costs memory before any stream is authenticated), and
	// MaxPathsPerSource those from one IP address; more are closed at
	// once.
	MaxListenerPaths  = 4096
	MaxPathsPerSource = 256
	// MaxOpening bounds the streams waiting for their first byte; more
	// are refused at once, so silent streams cannot pile up.
	MaxOpening = 256
)

// Listen takes QUIC connections on address's UDP port and returns a
// listener of their streams.
func (f *Factory) Listen(_ context.Context, network, address string, _ layer.ContextDialer) (net.Listener, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "listen", Net: "quic", Addr: addrString(address), Err: err}
	}
	var cert tls.Certificate
	var err error
	if f.o.CertFile != "" {
		cert, err = loadCertificate(f.o.CertFile)
	} else {
		cert, err = newCertificate()
	}
	if err != nil {
		return nil, opErr(err)
	}
	pin, err := PinOf(cert.Certificate[0])
	if err != nil {
		return nil, opErr(err)
	}
	laddr, err := net.ResolveUDPAddr(udpNetwork(network), address)
	if err != nil {
		return nil, opErr(err)
	}
	udp, err := net.ListenUDP(udpNetwork(network), laddr)
	if err != nil {
		return nil, opErr(err)
	}
	setBuffers(udp)
	tr := &quic.Transport{Conn: udp}
	ql, err := tr.Listen(&tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   f.protos,
		Certificates: []tls.Certificate{cert},
	}, f.config())
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, opErr(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{tr: tr, ql: ql, pin: pin, streams: make(chan net.Conn),
		ctx: ctx, cancel: cancel, paths: map[*path]struct{}{}, sources: map[netip.Addr]int{},
		opening: make(chan struct{}, MaxOpening)}
	listening.add(l)
	l.wg.Add(1)
	go l.acceptPaths()
	return l, nil
}

// listening holds the listeners whose socket is open, for CloseAll.
var listening = listenerSet{m: map[*listener]struct{}{}}

type listenerSet struct {
	mu sync.Mutex
	m  map[*listener]struct{}
}

func (ls *listenerSet) add(l *listener) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.m[l] = struct{}{}
}

func (ls *listenerSet) remove(l *listener) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.m, l)
}

// paths returns the paths of every open listener.
func (ls *listenerSet) paths() []*path {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []*path
	for l := range ls.m {
		l.mu.Lock()
		for p := range l.paths {
			out = append(out, p)
		}
		l.mu.Unlock()
	}
	return out
}

// A listener hands out the streams of the QUIC connections it accepts.
// Closing it stops taking connections and streams; those it handed out
// live on, and the socket closes when the last of them has ended.
type listener struct {
	tr      *quic.Transport
	ql      *quic.Listener
	pin     Pin
	streams chan net.Conn
	opening chan struct{}   // a slot per stream waiting for its first byte
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	paths   map[*path]struct{}
	sources map[netip.Addr]int // paths by the peer's address
	closed  bool
}

var _ net.Listener = (*listener)(nil)

// Pin returns the listener's key as dialers pin it.
func (l *listener) Pin() string { return l.pin.String() }

func (l *listener) Addr() net.Addr { return l.tr.Conn.LocalAddr() }

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.streams:
		return c, nil
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "quic", Addr: l.Addr(), Err: net.ErrClosed}
	}
}

func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return &net.OpError{Op: "close", Net: "quic", Addr: l.Addr(), Err: net.ErrClosed}
	}
	l.closed = true
	var unused []*path
	for p := range l.paths {
		p.mu.Lock()
		if p.refs == 0 {
			unused = append(unused, p)
		}
		p.mu.Unlock()
	}
	empty := len(l.paths) == 0
	l.mu.Unlock()
	l.cancel()
	l.ql.Close()
	for _, p := range unused {
		p.drain()
	}
	if empty {
		l.closeSocket()
	}
	return nil
}

func (l *listener) closeSocket() {
	listening.remove(l)
	l.tr.Close()
	l.tr.Conn.Close()
}

func (l *listener) acceptPaths() {
	defer l.wg.Done()
	for {
		qc, err := l.ql.Accept(l.ctx)
		if err != nil {
			return
		}
		binding, err := exporter(qc)
		if err != nil {
			continue
		}
		p := &path{ready: closedChan, qc: qc, binding: binding, unused: l.unused, dm: newDemux(qc)}
		if qc.ConnectionState().TLS.NegotiatedProtocol == alpnV2 {
			p.rc = newReceipts(qc)
		}
		src, _ := netconn.AddrPort(qc.RemoteAddr())
		l.mu.Lock()
		if l.closed || len(l.paths) >= MaxListenerPaths || l.sources[src.Addr()] >= MaxPathsPerSource {
			l.mu.Unlock()
			qc.CloseWithError(codeBusy, "too many connections")
			continue
		}
		l.paths[p] = struct{}{}
		l.sources[src.Addr()]++
		l.mu.Unlock()
		l.wg.Add(1)
		go l.acceptStreams(p)
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// unused is a listener path's unused hook: once the listener is closed, a
// path without streams closes, once what its last streams sent reached
// the peer (closing the QUIC connection would drop it: this process,
// not the kernel, retransmits it; see drain).
func (l *listener) unused(p *path) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		p.drain()
	}
}

// acceptStreams takes p's streams until the listener or the connection
// closes, then waits for the connection's end to forget it.
func (l *listener) acceptStreams(p *path) {
	defer l.wg.Done()
	for {
		s, err := p.qc.AcceptStream(l.ctx)
		if err != nil {
			break
		}
		select {
		case l.opening <- struct{}{}:
		default:
			s.CancelRead(codeBusyStream)
			s.CancelWrite(codeBusyStream)
			continue
		}
		p.hold()
		l.wg.Add(1)
		go l.open(s, p)
	}
	<-p.qc.Context().Done()
	src, _ := netconn.AddrPort(p.qc.RemoteAddr())
	l.mu.Lock()
	delete(l.paths, p)
	if l.sources[src.Addr()]--; l.sources[src.Addr()] <= 0 {
		delete(l.sources, src.Addr())
	}
	last := l.closed && len(l.paths) == 0
	l.mu.Unlock()
	if last {
		l.closeSocket()
	}
}

// open checks a new stream's first byte and hands the stream out.
func (l *listener) open(s *quic.Stream, p *path) {
	defer l.wg.Done()
	c := newConn(s, p)
	s.SetDeadline(time.Now().Add(openTimeout))
	var b [1]byte
	_, err := s.Read(b[:])
	if err == nil && b[0] == streamOpen {
		_, err = s.Write(b[:])
	}
	<-l.opening
	if err != nil || b[0] != streamOpen {
		s.CancelRead(codeBad)
		s.CancelWrite(codeBad)
		c.closed.Store(true)
		p.rc.dropped(s.StreamID())
		c.dropDatagrams()
		c.once.Do(p.release)
		return
	}
	s.SetDeadline(time.Time{})
	select {
	case l.streams <- c:
	case <-l.ctx.Done():
		c.Abort()
	}
}

func (l *listener) String() string { return fmt.Sprintf("quic listener %s (%s)", l.Addr(), l.pin) }

// drain closes p, which has no stream left, after drainTime and a few
// round trips, for its last frames (a reset has no receipt) to reach
// the peer, and with a vlink/2 peer not before every receipt it awaits
// came, or ExitWait passed: then the peer has read what its last
// streams sent.
func (p *path) drain() {
	shut := func() {
		p.mu.Lock()
		unused := p.refs == 0
		p.mu.Unlock()
		if unused {
			p.shut(codeGone, "listener closed")
		}
	}
	st := p.qc.ConnectionStats()
	wait := drainTime + 4*st.SmoothedRTT
	if p.rc == nil {
		time.AfterFunc(wait, shut)
		return
	}
	go func() {
		start := time.Now()
		p.settle(start.Add(max(ExitWait, wait)))
		t := time.NewTimer(time.Until(start.Add(wait)))
		defer t.Stop()
		select {
		case <-t.C:
			shut()
		case <-p.qc.Context().Done():
		}
	}()
}

package quic

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Defaults for the options left zero.
const (
	// DefaultIdleTimeout is how long a path may stay silent before every
	// stream on it fails. Keepalives are sent at a third of it, so a
	// working path never idles out while a stream is open, and a dead
	// peer (killed: QUIC runs in its process, and nothing answers for
	// it) is noticed within it and a keepalive's interval (RFC 9000
	// §10.1 restarts the timer on the first packet sent after the last
	// one received): 8 s, where TCP notices a killed peer at once when
	// its host answers with a reset.
	DefaultIdleTimeout = 6 * time.Second
	// DefaultWindow is the most a stream may have in flight unread; the
	// connection's bound is twice it. 16 MiB fills 1 Gbit/s over 100 ms
	// with room for loss recovery.
	DefaultWindow = 16 << 20
	// DefaultLinger is how long a dialer keeps a path's QUIC connection
	// once its last stream closed, for the next dial to reuse; longer
	// while the peer has not read all that stream sent (vlink/2).
	DefaultLinger = 30 * time.Second
	// MaxStreams bounds the streams a peer may have open on one path.
	MaxStreams = 1024
)

const (
	// The TLS application protocols, so that no other QUIC service takes
	// our streams: vlink/2 sends read receipts (receipts.go), vlink/1
	// does not. Both ends offer vlink/2 first and take vlink/1 still.
	alpnV1 = "vlink/1"
	alpnV2 = "vlink/2"
	// streamOpen opens a stream: the dialer sends it, and the listener
	// sends it back when it takes the stream. QUIC tells a listener of
	// a stream only when it carries a frame (a program whose server
	// speaks first would wait forever), and the answer tells the dialer
	// the path still leads to a listener, as a TCP connect does.
	streamOpen byte = 0x76
	// exporterLabel derives the channel binding (RFC 5705 exporter).
	exporterLabel = "EXPORTER-vlink-quic-channel-binding"

	// Stream and connection error codes on the wire.
	codeClosed     quic.StreamErrorCode      = 0x100 // Close with the other direction unfinished
	codeAbort      quic.StreamErrorCode      = 0x101 // Abort: the stream failed
	codeBad        quic.StreamErrorCode      = 0x102 // a stream that did not open with streamOpen
	codeBusyStream quic.StreamErrorCode      = 0x103 // too many streams opening at once
	codeIdle       quic.ApplicationErrorCode = 0x0   // a path closed with no stream left
	codeGone       quic.ApplicationErrorCode = 0x1   // the listener or the program went away
	codeBusy       quic.ApplicationErrorCode = 0x2   // the listener has too many connections
	codeBadReceipt quic.ApplicationErrorCode = 0x3   // the peer's receipt stream broke the protocol
)

func init() {
	layer.Register(layer.Spec{
		Name:      "quic",
		Kind:      layer.KindFactory,
		Terminal:  true,
		Encrypted: true,
		Summary:   "QUIC (reliable UDP, quic-go): one connection per path, a stream per vlink connection; for lossy, long paths",
		Params: []layer.Param{
			{Name: "pin", Type: layer.TypeString, Local: true,
				Doc: "the listener's key, SHA256:BASE64 as it logs it; without one, only a stack with a key authenticates the path"},
			{Name: "cert", Type: layer.TypeString, Local: true,
				Doc: "listener: a PEM file keeping its certificate and key, made (mode 600) if missing, so its pin survives restarts"},
			{Name: "idle", Type: layer.TypeDuration, Default: DefaultIdleTimeout.String(), Min: int64(time.Second), Max: int64(time.Hour), Local: true,
				Doc: "a path silent this long fails its streams (keepalives go at a third of it)"},
			{Name: "window", Type: layer.TypeSize, Default: "16M", Min: 64 << 10, Max: 1 << 30, Local: true,
				Doc: "the most one stream may have unread in flight (flow control); a path's is twice it"},
		},
		EndMarker: true,
		New: func(a layer.Args) (any, error) {
			o := Options{CertFile: a.String("cert"), IdleTimeout: a.Duration("idle"), Window: int(a.Size("window"))}
			if s := a.String("pin"); s != "" {
				p, err := ParsePin(s)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", layer.ErrBadParam, err)
				}
				o.Pin = &p
			}
			return New(o)
		},
	})
}

// Options configure a Factory. The zero value is usable.
type Options struct {
	// Pin, if set, is the listener key a dialer accepts; nil leaves the
	// check to the hello's key (see the package comment).
	Pin *Pin
	// CertFile keeps a listener's certificate and key (PEM), made if
	// missing. Empty means a new key for each Listen.
	CertFile string
	// IdleTimeout: zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Window: zero means DefaultWindow.
	Window int
	// Linger: zero means DefaultLinger.
	Linger time.Duration
}

// Validate reports whether the options are usable.
func (o *Options) Validate() error {
	if o.IdleTimeout < 0 || (o.IdleTimeout > 0 && o.IdleTimeout < 10*time.Millisecond) {
		return fmt.Errorf("quic: idle timeout %v: want at least 10ms", o.IdleTimeout)
	}
	if o.Window < 0 || (o.Window > 0 && o.Window < 16<<10) {
		return fmt.Errorf("quic: window of %d bytes: want at least 16 KiB", o.Window)
	}
	if o.Linger < 0 {
		return fmt.Errorf("quic: negative linger %v", o.Linger)
	}
	return nil
}

// A Factory dials and listens on QUIC.
type Factory struct {
	o      Options
	protos []string // the ALPN protocols offered, preferred first; a test offers vlink/1 alone
}

var _ layer.ListenFactory = (*Factory)(nil)

// New returns a factory with options o.
func New(o Options) (*Factory, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.IdleTimeout = cmp.Or(o.IdleTimeout, DefaultIdleTimeout)
	o.Window = cmp.Or(o.Window, DefaultWindow)
	o.Linger = cmp.Or(o.Linger, DefaultLinger)
	return &Factory{o: o, protos: []string{alpnV2, alpnV1}}, nil
}

func (f *Factory) String() string { return "quic" }

func (f *Factory) config() *quic.Config {
	return &quic.Config{
		MaxIdleTimeout:                 f.o.IdleTimeout,
		KeepAlivePeriod:                f.o.IdleTimeout / 3,
		MaxStreamReceiveWindow:         uint64(f.o.Window),
		MaxConnectionReceiveWindow:     2 * uint64(f.o.Window),
		MaxIncomingStreams:             MaxStreams,
		MaxIncomingUniStreams:          1, // the peer's receipt stream
		InitialStreamReceiveWindow:     512 << 10,
		InitialConnectionReceiveWindow: 512 << 10,
		EnableDatagrams:                true, // datagram.go
	}
}

// DialContext opens a stream to address (host:port, UDP) on the path's
// QUIC connection, making the connection if there is none, and returns
// once the listener took the stream; ctx bounds the set-up.
//
// A path in the pool may have died unseen (the listener's process
// restarted, say): a stream on it gets no answer. So on a path made
// earlier the answer is awaited for a few round trips only; without it,
// the dial goes on a new path, and the old one is left to the streams
// it has.
func (f *Factory) DialContext(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "quic", Addr: addrString(address), Err: err}
	}
	var stale *path
	for {
		p, fresh, err := f.path(ctx, network, address, stale)
		if err != nil {
			return nil, opErr(err)
		}
		c, err := p.open(ctx, fresh)
		if err == nil {
			return c, nil
		}
		p.release()
		if fresh || ctx.Err() != nil || stale != nil {
			return nil, opErr(err)
		}
		stale = p
	}
}

// open opens a stream on p and waits for the listener's answer: until
// ctx's end on a fresh path, a few round trips on an older one.
func (p *path) open(ctx context.Context, fresh bool) (*conn, error) {
	s, err := p.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	if !fresh {
		st := p.qc.ConnectionStats()
		probe := max(3*st.SmoothedRTT, st.SmoothedRTT+4*st.MeanDeviation) + 250*time.Millisecond
		if deadline.IsZero() || time.Now().Add(probe).Before(deadline) {
			deadline = time.Now().Add(probe)
		}
	}
	s.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { s.SetDeadline(time.Now()) })
	var b [1]byte
	_, err = s.Write([]byte{streamOpen})
	if err == nil {
		_, err = io.ReadFull(s, b[:])
	}
	stop()
	if err == nil && b[0] != streamOpen {
		err = errors.New("quic: the listener answered the stream with something else")
	}
	if err != nil {
		s.CancelRead(codeAbort)
		s.CancelWrite(codeAbort)
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, err
	}
	s.SetDeadline(time.Time{})
	return newConn(s, p), nil
}

type addrString string

func (a addrString) Network() string { return "quic" }
func (a addrString) String() string  { return string(a) }

// The dialers' paths, by address and options: one QUIC connection each,
// made by the first dial that needs it and closed when it has had no
// stream for its linger time, or when it breaks.
var pool = struct {
	mu    sync.Mutex
	paths map[string]*path // the path a dial takes, by key
	live  map[*path]bool   // every dialer path not yet closed, stale ones too
}{paths: map[string]*path{}, live: map[*path]bool{}}

// CloseAll closes every QUIC connection the package's dialers keep, and
// those its listeners accepted, failing the streams still on them, so
// that each peer learns now that the path ended, not at its idle
// timeout. Programs call it at exit (vlink's commands do); tests call it
// to leave no goroutine behind.
//
// First it waits, at most ExitWait in all, until the peer has read
// (and receipted) every stream this process closed or ended with
// CloseWrite, or that stream's connection ended: QUIC's retransmissions
// live in this process, and closing the connections would drop what is
// still unacknowledged. Streams reset (Abort) and connections to a
// vlink/1 peer, which sends no receipts, are not waited for.
func CloseAll() {
	deadline := time.Now().Add(ExitWait)
	all := listening.paths()
	pool.mu.Lock()
	for p := range pool.live {
		all = append(all, p)
	}
	clear(pool.paths)
	pool.mu.Unlock()
	for _, p := range all {
		<-p.ready
		p.settle(deadline)
	}
	for _, p := range all {
		p.shut(codeGone, "closed")
	}
}

// Paths returns how many QUIC connections the dialers hold (stale ones
// that still carry streams too), for tests and diagnostics.
func Paths() int {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	return len(pool.live)
}

// path returns the path to address, up, with a hold on it that the
// caller gives back with release, and whether this call made it. A
// stale path, if given, is taken out of the pool first.
func (f *Factory) path(ctx context.Context, network, address string, stale *path) (*path, bool, error) {
	pin := ""
	if f.o.Pin != nil {
		pin = f.o.Pin.String()
	}
	key := fmt.Sprintf("%s %s pin=%s idle=%v window=%d linger=%v alpn=%v", network, address, pin, f.o.IdleTimeout, f.o.Window, f.o.Linger, f.protos)
	pool.mu.Lock()
	p := pool.paths[key]
	if p != nil && (p.broken() || p == stale) {
		delete(pool.paths, key)
		p = nil
	}
	first := p == nil
	if first {
		p = &path{ready: make(chan struct{}), linger: f.o.Linger, unused: (*path).lingerOn}
		p.onIdle = func() {
			pool.mu.Lock()
			if pool.paths[key] == p {
				delete(pool.paths, key)
			}
			delete(pool.live, p)
			pool.mu.Unlock()
		}
		pool.paths[key] = p
		pool.live[p] = true
	}
	p.hold()
	pool.mu.Unlock()

	if first {
		qc, tr, err := f.connect(ctx, network, address)
		var binding []byte
		if err == nil {
			binding, err = exporter(qc)
		}
		var rc *receipts
		var dm *demux
		if err == nil && qc.ConnectionState().TLS.NegotiatedProtocol == alpnV2 {
			rc = newReceipts(qc)
		}
		if err == nil {
			dm = newDemux(qc)
		}
		p.mu.Lock()
		p.qc, p.binding, p.rc, p.dm, p.err = qc, binding, rc, dm, err
		p.mu.Unlock()
		close(p.ready)
		if err == nil {
			// However the connection ends (unused, broken, CloseAll),
			// the pool forgets it and its socket closes.
			go func() {
				<-qc.Context().Done()
				p.onIdle()
				tr.Close()
				tr.Conn.Close()
			}()
		} else {
			p.onIdle() // a path that failed to connect is no path
		}
	} else {
		select {
		case <-p.ready:
		case <-ctx.Done():
			p.release()
			return nil, false, ctx.Err()
		}
	}
	if p.err != nil {
		p.release()
		return nil, false, p.err
	}
	return p, first, nil
}

// fallbackDelay is how long a connection attempt to one of a name's
// addresses has before the next address is tried beside it (RFC 8305's
// Happy Eyeballs, as net.Dialer does for TCP).
const fallbackDelay = 300 * time.Millisecond

// connect makes a QUIC connection to address. A name with several
// addresses is tried address after address, each attempt started
// fallbackDelay after the last or when it failed; the first connection
// made wins and the others are closed.
func (f *Factory) connect(ctx context.Context, network, address string) (*quic.Conn, *quic.Transport, error) {
	addrs, err := resolve(ctx, network, address)
	if err != nil {
		return nil, nil, err
	}
	if len(addrs) == 1 {
		return f.connectTo(ctx, network, addrs[0])
	}
	type result struct {
		qc  *quic.Conn
		tr  *quic.Transport
		err error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, len(addrs))
	next, running := 0, 0
	var firstErr error
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			if next < len(addrs) {
				a := addrs[next]
				next++
				running++
				go func() {
					qc, tr, err := f.connectTo(ctx, network, a)
					results <- result{qc, tr, err}
				}()
				timer.Reset(fallbackDelay)
			}
		case r := <-results:
			running--
			if r.err == nil {
				cancel()
				go func() { // the attempts still running lose
					for ; running > 0; running-- {
						if r := <-results; r.err == nil {
							r.qc.CloseWithError(codeGone, "")
							r.tr.Close()
							r.tr.Conn.Close()
						}
					}
				}()
				return r.qc, r.tr, nil
			}
			firstErr = cmp.Or(firstErr, r.err)
			if next == len(addrs) && running == 0 {
				return nil, nil, firstErr
			}
			if next < len(addrs) {
				timer.Reset(0) // the next address now
			}
		}
	}
}

// connectTo makes a QUIC connection to raddr from a UDP socket of its own.
func (f *Factory) connectTo(ctx context.Context, network string, raddr *net.UDPAddr) (*quic.Conn, *quic.Transport, error) {
	udp, err := net.ListenUDP(udpNetwork(network), nil)
	if err != nil {
		return nil, nil, err
	}
	setBuffers(udp)
	tr := &quic.Transport{Conn: udp}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: f.protos,
		ServerName: "vlink",
		// Neither names nor a chain are what identifies a listener:
		// the pin does (VerifyConnection), or else the hello's key,
		// whose proofs cover this connection's channel binding.
		InsecureSkipVerify: true,
	}
	if f.o.Pin != nil {
		tc.VerifyConnection = verifyPin(*f.o.Pin)
	}
	qc, err := tr.Dial(ctx, raddr, tc, f.config())
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, nil, err
	}
	return qc, tr, nil
}

func udpNetwork(network string) string {
	switch network {
	case "tcp4", "udp4":
		return "udp4"
	case "tcp6", "udp6":
		return "udp6"
	}
	return "udp"
}

// lookupNetIP looks names up; a test replaces it.
var lookupNetIP = net.DefaultResolver.LookupNetIP

// resolve returns address's UDP addresses, looking its host up under
// ctx, in the order to try them: the resolver's first, then the families
// alternating (RFC 8305).
func resolve(ctx context.Context, network, address string) ([]*net.UDPAddr, error) {
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", ps, err)
	}
	udp := func(ip netip.Addr) *net.UDPAddr {
		return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip.Unmap(), uint16(port)))
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []*net.UDPAddr{udp(ip)}, nil
	}
	nw := "ip"
	switch udpNetwork(network) {
	case "udp4":
		nw = "ip4"
	case "udp6":
		nw = "ip6"
	}
	ips, err := lookupNetIP(ctx, nw, host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var first, other []netip.Addr
	for _, ip := range ips {
		if ip.Unmap().Is4() == ips[0].Unmap().Is4() {
			first = append(first, ip)
		} else {
			other = append(other, ip)
		}
	}
	out := make([]*net.UDPAddr, 0, len(ips))
	for i := 0; i < len(first) || i < len(other); i++ {
		if i < len(first) {
			out = append(out, udp(first[i]))
		}
		if i < len(other) {
			out = append(out, udp(other[i]))
		}
	}
	return out, nil
}

// setBuffers asks for socket buffers that hold a path's window, as
// quic-go wants them (7 MiB); as root past the system's limits. Where
// neither works, quic-go says so once on the log.
func setBuffers(udp *net.UDPConn) {
	netconn.SetUDPBuffers(udp, 7<<20)
}

// exporter returns the channel binding of a QUIC connection: the same on
// both ends of one TLS session, different across a man in the middle.
func exporter(qc *quic.Conn) ([]byte, error) {
	cs := qc.ConnectionState().TLS
	b, err := cs.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		qc.CloseWithError(codeGone, "")
		return nil, fmt.Errorf("quic: channel binding: %w", err)
	}
	return b, nil
}

// A path is one QUIC connection and the streams that hold it.
type path struct {
	ready   chan struct{} // closed once qc and binding, or err, are set
	qc      *quic.Conn
	binding []byte
	rc      *receipts // vlink/2's read receipts; nil with a vlink/1 peer
	dm      *demux    // the streams' QUIC datagrams; nil if an end takes none
	err     error
	linger  time.Duration
	onIdle  func()      // a dialer's: takes the path out of the pool
	unused  func(*path) // called when the last stream gives its hold back

	mu    sync.Mutex
	refs  int
	timer *time.Timer
}

func (p *path) hold() {
	p.mu.Lock()
	p.refs++
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
}

// release gives a hold back; on the last one the path's unused hook
// decides what happens to it (a dialer's lingers, a closed listener's
// closes).
func (p *path) release() {
	p.mu.Lock()
	p.refs--
	unused := p.refs == 0 && p.qc != nil
	p.mu.Unlock()
	if unused && p.unused != nil {
		p.unused(p)
	}
}

// lingerOn is a dialer path's unused hook: the path closes once it has
// had no stream for its linger time.
func (p *path) lingerOn() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refs == 0 && p.timer == nil {
		p.timer = time.AfterFunc(p.linger, p.idle)
	}
}

func (p *path) idle() {
	p.mu.Lock()
	unused := p.refs == 0
	p.timer = nil
	p.mu.Unlock()
	if !unused {
		return
	}
	select {
	case <-p.rc.done():
	default:
		// A stream closed here is unread there yet, and closing the
		// connection would drop it: linger again, as TCP's kernel
		// keeps a closed socket's data until it is read.
		p.lingerOn()
		return
	}
	p.shut(codeIdle, "")
}

// shut closes the path's QUIC connection, failing its streams.
func (p *path) shut(code quic.ApplicationErrorCode, why string) {
	if p.qc != nil {
		p.qc.CloseWithError(code, why)
	}
}

func (p *path) broken() bool {
	select {
	case <-p.ready:
		return p.err != nil || p.qc.Context().Err() != nil
	default:
		return false
	}
}

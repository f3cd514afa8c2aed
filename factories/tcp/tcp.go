// Package tcp is vlink's plain TCP factory, the terminal layer every stack
// ends with: it reaches the network itself.
//
// Beyond what net.Dialer does (dual-stack dialing with Happy Eyeballs), it
// sets TCP_NODELAY and keep-alives, can restrict the address family, dial
// from a chosen source address, and confine local ports to a range so that
// connections pass firewalls that only open a few ports. Connections are the
// net package's own *net.TCPConn, unwrapped, so relaying two of them reaches
// the kernel's zero-copy path (splice(2)), and errors are the net package's
// *net.OpError.
//
// Importing the package registers the layer "tcp" with package vlink.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

const (
	// DefaultKeepAlive is the keep-alive idle time and probe interval when
	// none is given, as in net.Dialer.
	DefaultKeepAlive = 15 * time.Second
	// MaxKeepAlive bounds the keepalive parameter.
	MaxKeepAlive = 2 * time.Hour
	// KeepAliveCount is the number of unanswered probes after which the
	// connection fails, as the net package sets it.
	KeepAliveCount = 9
)

func init() {
	layer.Register(layer.Spec{
		Name:     "tcp",
		Kind:     layer.KindFactory,
		Terminal: true,
		Summary:  "plain TCP: dual-stack, nodelay, keep-alives, source address and port range",
		Params: []layer.Param{
			{Name: "nodelay", Type: layer.TypeBool, Default: "true", Local: true,
				Doc: "set TCP_NODELAY: send small writes at once instead of coalescing them (Nagle's algorithm)"},
			{Name: "keepalive", Type: layer.TypeDuration, Default: DefaultKeepAlive.String(), Min: 0, Max: int64(MaxKeepAlive), Local: true,
				Doc: "idle time before the first keep-alive probe and interval between probes: a dead peer or path is noticed after ten times this, idle or with data in flight (TCP_USER_TIMEOUT, Linux); 0 disables keep-alives"},
			{Name: "family", Type: layer.TypeString, Default: "any", Local: true,
				Doc: `address family: "any" (IPv4 and IPv6, racing both as net.Dialer does), "4" (IPv4 only) or "6" (IPv6 only)`},
			{Name: "local", Type: layer.TypeString, Local: true,
				Doc: "source IP address to dial from; empty lets the kernel choose (it also restricts dialing to that address's family)"},
			{Name: "ports", Type: layer.TypeString, Local: true,
				Doc: `local port range like "40000-40100" (or one port): dialing binds a free port of the range, listening on port 0 picks one; empty means any port`},
			{Name: "cc", Type: layer.TypeString, Local: true,
				Doc: "congestion control of the connection's TCP sender, e.g. bbr for a lossy long path (Linux, TCP_CONGESTION); a gateway's hello asks it to use the same on its side, for what it sends back; empty: the system's default"},
		},
		New: func(a layer.Args) (any, error) { return newFromArgs(a) },
	})
}

// args is the part of layer.Args the factory reads; tests supply their own.
type args interface {
	Bool(name string) bool
	Duration(name string) time.Duration
	String(name string) string
}

func newFromArgs(a args) (*Factory, error) {
	o := Options{NoNagle: !a.Bool("nodelay")}
	o.KeepAlive = a.Duration("keepalive")
	if o.KeepAlive == 0 {
		o.KeepAlive = -1 // the parameter's 0 means off; the field's 0 means the default
	}
	switch f := a.String("family"); f {
	case "any", "":
		o.Network = "tcp"
	case "4":
		o.Network = "tcp4"
	case "6":
		o.Network = "tcp6"
	default:
		return nil, fmt.Errorf("%w: family=%q: want any, 4 or 6", layer.ErrBadParam, f)
	}
	if s := a.String("local"); s != "" {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%w: local=%q is not an IP address", layer.ErrBadParam, s)
		}
		o.Local = ip
	}
	if s := a.String("ports"); s != "" {
		r, err := ParsePortRange(s)
		if err != nil {
			return nil, err
		}
		o.Ports = r
	}
	o.CongestionControl = a.String("cc")
	return New(o)
}

// Options configure a Factory. The zero value dials and listens like
// net.Dialer and net.ListenConfig with their zero values.
type Options struct {
	// NoNagle, if true, leaves Nagle's algorithm on (TCP_NODELAY off).
	// Zero: TCP_NODELAY is set, as the net package does.
	NoNagle bool
	// KeepAlive is the keep-alive idle time and probe interval; after
	// KeepAliveCount unanswered probes the connection fails. Zero means
	// DefaultKeepAlive; negative disables keep-alives.
	KeepAlive time.Duration
	// Network restricts the address family: "tcp4" or "tcp6". Zero (or
	// "tcp") allows both.
	Network string
	// Local is the source address for dialing. Zero lets the kernel
	// choose. A non-zero Local restricts dialing to its family.
	Local netip.Addr
	// Ports confines local ports: dialing binds a free port of the range
	// and listening on port 0 picks one. Zero means any port.
	Ports PortRange
	// CongestionControl is the congestion control algorithm of the
	// connections' TCP senders, "bbr" say (Linux only; see
	// netconn.SetCongestionControl); a listener's accepted connections
	// take it too. Zero: the system's default.
	CongestionControl string
}

// A Factory dials and listens on TCP. It implements layer.ListenFactory.
// It is safe for concurrent use.
type Factory struct {
	o Options
}

var (
	_ layer.ListenFactory        = (*Factory)(nil)
	_ layer.CongestionControlled = (*Factory)(nil)
)

// New returns a Factory with the given options. Errors match
// layer.ErrBadParam.
func New(o Options) (*Factory, error) {
	switch o.Network {
	case "":
		o.Network = "tcp"
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("%w: network %q: want tcp, tcp4 or tcp6", layer.ErrBadParam, o.Network)
	}
	if o.KeepAlive > MaxKeepAlive {
		return nil, fmt.Errorf("%w: keepalive=%s is over %s", layer.ErrBadParam, o.KeepAlive, MaxKeepAlive)
	}
	if o.Local.IsValid() {
		o.Local = o.Local.Unmap()
		fam := "tcp4"
		if o.Local.Is6() {
			fam = "tcp6"
		}
		if o.Network != "tcp" && o.Network != fam {
			return nil, fmt.Errorf("%w: local=%s is not a %s address", layer.ErrBadParam, o.Local, o.Network)
		}
		if o.Local.IsUnspecified() || o.Local.IsMulticast() {
			return nil, fmt.Errorf("%w: local=%s cannot be a source address", layer.ErrBadParam, o.Local)
		}
	}
	if cc := o.CongestionControl; cc != "" {
		if !netconn.ValidCongestionControl(cc) {
			return nil, fmt.Errorf("%w: cc=%q is not a congestion control name", layer.ErrBadParam, cc)
		}
		if runtime.GOOS != "linux" {
			return nil, fmt.Errorf("%w: cc: only Linux lets a connection choose its congestion control", layer.ErrBadParam)
		}
	}
	if !o.Ports.IsZero() {
		if err := o.Ports.check(); err != nil {
			return nil, err
		}
		if !canBindPorts {
			return nil, fmt.Errorf("%w: ports is not supported on this system", layer.ErrBadParam)
		}
	}
	return &Factory{o: o}, nil
}

// keepAlive sets the probe interval to the idle time too; the net
// package's KeepAlive field sets the idle time only.
func (f *Factory) keepAlive() net.KeepAliveConfig {
	if f.o.KeepAlive < 0 {
		return net.KeepAliveConfig{}
	}
	ka := f.o.KeepAlive
	if ka == 0 {
		ka = DefaultKeepAlive
	}
	return net.KeepAliveConfig{Enable: true, Idle: ka, Interval: ka, Count: KeepAliveCount}
}

// userTimeout is how long sent data may stay unacknowledged before the
// connection fails: the keep-alives' own bound (idle time, then
// KeepAliveCount probes), so that a dead path fails a connection within
// the same time whether it was idle or carrying data. Zero without
// keep-alives.
func (f *Factory) userTimeout() time.Duration {
	ka := f.keepAlive()
	if !ka.Enable {
		return 0
	}
	return ka.Idle + time.Duration(ka.Count)*ka.Interval
}

// control sets the options a socket needs before it connects or
// listens.
func (f *Factory) control(_, _ string, rc syscall.RawConn) error {
	if cc := f.o.CongestionControl; cc != "" {
		if err := netconn.SetCongestionControlRaw(rc, cc); err != nil {
			return err
		}
	}
	if d := f.userTimeout(); d > 0 {
		return setUserTimeout(rc, d)
	}
	return nil
}

// CongestionControl is the congestion control algorithm the factory's
// connections use, "" for the system's default (layer.CongestionControlled).
func (f *Factory) CongestionControl() string { return f.o.CongestionControl }

// PreparedLayer returns the factory that the stack layer name:params
// builds when it is tcp's and Prepared(target); else nil, and the caller
// dials through the stack.
func PreparedLayer(name string, params map[string]string, target netip.Addr) *Factory {
	spec, ok := layer.Lookup(name)
	if name != "tcp" || !ok {
		return nil
	}
	v, err := spec.Build(params)
	if err != nil {
		return nil
	}
	if f, ok := v.(*Factory); ok && f.Prepared(target) {
		return f
	}
	return nil
}

// Prepared reports whether PrepareSocket carries out every option of f
// for a dial to an address of target's family: not a port range or a
// source address, which DialContext binds, nor a family other than
// target's, whose error DialContext gives. A dialer of its own (an
// event loop, vlink exec's agent) uses DialContext for the rest.
func (f *Factory) Prepared(target netip.Addr) bool {
	fam := "tcp4"
	if target.Is6() && !target.Is4In6() {
		fam = "tcp6"
	}
	return f.o.Ports.IsZero() && !f.o.Local.IsValid() && (f.o.Network == "tcp" || f.o.Network == fam)
}

// Options returns the factory's options, with defaults filled in.
func (f *Factory) Options() Options { return f.o }

// resolveNetwork combines the caller's network with the factory's family
// and, for dialing, its source address; a contradiction is an error.
func (f *Factory) resolveNetwork(network string, dial bool) (string, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return "", net.UnknownNetworkError(network)
	}
	want := f.o.Network
	if dial && f.o.Local.IsValid() {
		want = "tcp4"
		if f.o.Local.Is6() {
			want = "tcp6"
		}
	}
	switch {
	case network == "tcp":
		return want, nil
	case want == "tcp" || want == network:
		return network, nil
	}
	return "", fmt.Errorf("%w: %s, the factory allows %s only", ErrFamily, network, want)
}

// ErrFamily is matched by a dial or listen whose network the factory's
// family (or, for dialing, its source address) forbids.
var ErrFamily = errors.New("address family not allowed")

// DialContext connects to address ("host:port"; names are resolved and
// IPv4 and IPv6 raced as net.Dialer does). tcp is terminal: forward is
// ignored (a stack hands it nil). The connection is a *net.TCPConn.
func (f *Factory) DialContext(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Conn, error) {
	nw, err := f.resolveNetwork(network, true)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	d := net.Dialer{KeepAlive: f.o.KeepAlive, KeepAliveConfig: f.keepAlive(), Control: f.control}
	var c net.Conn
	if f.o.Ports.IsZero() {
		if f.o.Local.IsValid() {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.o.Local, 0))
		}
		c, err = d.DialContext(ctx, nw, address)
	} else {
		c, err = f.dialInRange(ctx, &d, nw, address)
	}
	if err != nil {
		return nil, err
	}
	if f.o.NoNagle {
		if err := c.(*net.TCPConn).SetNoDelay(false); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// dialInRange binds each socket the dialer makes (two when IPv4 and IPv6
// race) to a free port of the range before it connects. A port that binds
// but whose 4-tuple is taken (EADDRNOTAVAIL at connect, e.g. a TIME_WAIT
// from an earlier connection to the same peer) is skipped by dialing again.
func (f *Factory) dialInRange(ctx context.Context, d *net.Dialer, network, address string) (net.Conn, error) {
	p := f.o.Ports.picker()
	d.ControlContext = func(_ context.Context, network, address string, rc syscall.RawConn) error {
		if err := p.bind(rc, network, f.o.Local); err != nil {
			return err
		}
		return f.control(network, address, rc)
	}
	for {
		c, err := d.DialContext(ctx, network, address)
		if err == nil || !isAddrNotAvail(err) {
			return c, err
		}
		if p.left() == 0 {
			var oe *net.OpError
			if errors.As(err, &oe) {
				oe.Err = fmt.Errorf("%w %s: %w", ErrNoFreePort, f.o.Ports, oe.Err)
			}
			return nil, err
		}
	}
}

// Listen listens on address. When address has port 0 and the factory has
// a port range, it listens on a free port of the range. Accepted
// connections are *net.TCPConn with the factory's socket options.
func (f *Factory) Listen(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Listener, error) {
	nw, err := f.resolveNetwork(network, false)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	lc := net.ListenConfig{KeepAlive: f.o.KeepAlive, KeepAliveConfig: f.keepAlive(), Control: f.control}
	var ln net.Listener
	host, port, splitErr := net.SplitHostPort(address)
	if f.o.Ports.IsZero() || splitErr != nil || (port != "0" && port != "") {
		ln, err = lc.Listen(ctx, nw, address)
	} else {
		ln, err = f.listenInRange(ctx, &lc, nw, host)
	}
	if err != nil {
		return nil, err
	}
	if f.o.NoNagle {
		return &nagleListener{ln.(*net.TCPListener)}, nil
	}
	return ln, nil
}

func (f *Factory) listenInRange(ctx context.Context, lc *net.ListenConfig, network, host string) (net.Listener, error) {
	p := f.o.Ports.picker()
	for {
		port, ok := p.next()
		if !ok {
			return nil, &net.OpError{Op: "listen", Net: network,
				Err: fmt.Errorf("%w %s on %s", ErrNoFreePort, f.o.Ports, strings.TrimSuffix(net.JoinHostPort(host, ""), ":"))}
		}
		ln, err := lc.Listen(ctx, network, net.JoinHostPort(host, fmt.Sprint(port)))
		if err == nil || !isAddrInUse(err) {
			return ln, err
		}
	}
}

// nagleListener turns TCP_NODELAY off on accepted connections, which the
// net package turns on.
type nagleListener struct {
	*net.TCPListener
}

func (l *nagleListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	if err := c.SetNoDelay(false); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

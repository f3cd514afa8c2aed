// Package socks is vlink's SOCKS client factory: "socks4", "socks4a" and
// "socks5" layers that reach the destination through a SOCKS proxy. The
// proxy itself is reached through the layer below (tcp, or another proxy,
// or an SSH tunnel), so proxies chain like any other factories.
//
// SOCKS5 (RFC 1928) speaks through github.com/txthinking/socks5's message
// types; its Client is not used, as it dials the proxy itself and takes no
// context. Username/password authentication is RFC 1929. Names are
// resolved by the proxy unless resolve=local. SOCKS4 carries IPv4
// addresses only, so a name is resolved here; SOCKS4a sends the name for
// the proxy to resolve. The SOCKS4 messages are small and written here.
//
// A dial returns the connection to the proxy once it has granted the
// CONNECT, unwrapped (a *net.TCPConn over tcp, so relays still take the
// zero-copy path).
// Errors are *net.OpError naming the proxy, wrapping ErrAuth, ErrProtocol
// or a *ReplyError with the proxy's reply code.
//
// Importing the package registers the layers with package vlink.
package socks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Version is a SOCKS protocol version.
type Version uint8

const (
	V4  Version = 4    // SOCKS4: IPv4 destinations, resolved by the client
	V4a Version = 0x4a // SOCKS4a: names resolved by the proxy
	V5  Version = 5    // SOCKS5 (RFC 1928)
)

func (v Version) String() string {
	switch v {
	case V4:
		return "socks4"
	case V4a:
		return "socks4a"
	case V5:
		return "socks5"
	}
	return fmt.Sprintf("socks(%d)", uint8(v))
}

func init() {
	addr := layer.Param{Name: "addr", Type: layer.TypeString, Required: true, Hop: true,
		Doc: "the proxy's HOST:PORT, reached through the layer below"}
	for _, v := range []Version{V4, V4a, V5} {
		params := []layer.Param{addr}
		var summary string
		switch v {
		case V4:
			summary = "SOCKS4 proxy client: IPv4 destinations, names resolved locally"
			params = append(params, layer.Param{Name: "user", Type: layer.TypeString, Secret: true,
				Doc: "user id sent to the proxy (SOCKS4 has no password); shown nowhere, as a proxy URL's user-info"})
		case V4a:
			summary = "SOCKS4a proxy client: names resolved by the proxy"
			params = append(params, layer.Param{Name: "user", Type: layer.TypeString, Secret: true,
				Doc: "user id sent to the proxy (SOCKS4a has no password); shown nowhere, as a proxy URL's user-info"})
		case V5:
			summary = "SOCKS5 proxy client: username/password auth, names resolved by the proxy"
			params = append(params,
				layer.Param{Name: "user", Type: layer.TypeString, Secret: true,
					Doc: "user name for username/password authentication (RFC 1929); needs password-file or password-env; shown nowhere, as a proxy URL's user-info"},
				layer.Param{Name: "password-file", Type: layer.TypeString,
					Doc: "file holding the password (mode 600); never put a password in a stack"},
				layer.Param{Name: "password-env", Type: layer.TypeString,
					Doc: "environment variable holding the password"},
				layer.Param{Name: "password", Type: layer.TypeString, Secret: true,
					Doc: "the password itself, as a proxy URL gives it (socks5h://user:password@host); shown nowhere, but visible to other users in process listings: prefer password-file"},
				layer.Param{Name: "resolve", Type: layer.TypeString, Default: "remote",
					Doc: `who resolves destination names: "remote" (the proxy; names stay private to the far side) or "local"`})
		}
		layer.Register(layer.Spec{
			Name:    v.String(),
			Kind:    layer.KindFactory,
			Summary: summary,
			Params:  params,
			New:     func(a layer.Args) (any, error) { return fromArgs(v, a) },
		})
	}
}

func fromArgs(v Version, a layer.Args) (*Factory, error) {
	o := Options{Version: v, Proxy: a.String("addr"), User: a.String("user")}
	if v == V5 {
		pw, err := secret.Password(a.String("password"), a.String("password-file"), a.String("password-env"))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", layer.ErrBadParam, err)
		}
		o.Password = pw
		switch r := a.String("resolve"); r {
		case "remote":
		case "local":
			o.ResolveLocally = true
		default:
			return nil, fmt.Errorf("%w: resolve=%q: want remote or local", layer.ErrBadParam, r)
		}
	}
	return New(o)
}

// Options configure a Factory.
type Options struct {
	// Version is the protocol: V4, V4a or V5.
	Version Version
	// Proxy is the proxy's host:port.
	Proxy string
	// User is the SOCKS4 user id, or the SOCKS5 user name. A SOCKS5
	// user needs a Password; without one, no authentication is offered.
	User string
	// Password is the SOCKS5 password. It is never printed.
	Password string
	// ResolveLocally makes SOCKS5 resolve destination names here and
	// send addresses. Zero: the proxy resolves them. SOCKS4 always
	// resolves here, SOCKS4a never.
	ResolveLocally bool
}

// String describes the options with the password redacted.
func (o Options) String() string {
	s := fmt.Sprintf("%s proxy %s", o.Version, o.Proxy)
	if o.User != "" {
		s += " user [redacted]" // user-info, as a proxy URL has it
	}
	if o.Password != "" {
		s += " password [redacted]"
	}
	return s
}

// Validate reports options that cannot work; errors match
// layer.ErrBadParam.
func (o Options) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", layer.ErrBadParam, fmt.Sprintf(format, args...))
	}
	switch o.Version {
	case V4, V4a, V5:
	default:
		return bad("unknown SOCKS version %d", o.Version)
	}
	if _, _, err := splitDest(o.Proxy); err != nil {
		return bad("addr=%q: %v", o.Proxy, err)
	}
	switch {
	case o.Version == V5 && o.User != "" && o.Password == "":
		return bad("user %q has no password: give password-file or password-env", o.User)
	case o.Version == V5 && o.User == "" && o.Password != "":
		return bad("a password without a user")
	case o.Version == V5 && (len(o.User) > 255 || len(o.Password) > 255):
		return bad("SOCKS5 user names and passwords are at most 255 bytes")
	case o.Version != V5 && o.Password != "":
		return bad("%s has no passwords", o.Version)
	case o.Version != V5 && o.ResolveLocally:
		return bad("%s decides who resolves names", o.Version)
	case len(o.User) > maxUserID:
		return bad("user is longer than %d bytes", maxUserID)
	}
	for i := 0; i < len(o.User); i++ {
		if o.User[i] == 0 {
			return bad("user holds a NUL byte")
		}
	}
	return nil
}

// A Factory dials through a SOCKS proxy. It implements layer.Factory and
// is safe for concurrent use.
type Factory struct {
	o Options
}

var _ layer.Factory = (*Factory)(nil)

// New returns a Factory for the options.
func New(o Options) (*Factory, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Factory{o: o}, nil
}

// String describes the factory, password redacted.
func (f *Factory) String() string { return f.o.String() }

// Errors matched by a failed dial (with errors.Is). A refusal is a
// *ReplyError, which also matches ErrRefused.
var (
	// ErrAuth: the proxy wants authentication we cannot give, or
	// rejected the credentials. It matches vlink.ErrAuth too.
	ErrAuth = fmt.Errorf("socks: proxy %w", layer.ErrAuth)
	// ErrRefused: the proxy would not connect to the destination.
	ErrRefused = errors.New("socks: proxy refused the destination")
	// ErrProtocol: the proxy's answer is not SOCKS, or not the version
	// asked for.
	ErrProtocol = errors.New("socks: malformed answer from the proxy")
)

// A ReplyError is a proxy's refusal of a CONNECT, with its reply code.
// It matches ErrRefused; codes that say the destination could not be
// reached also match vlink.ErrUnreachable and the errno they stand for
// (syscall.ECONNREFUSED for "connection refused"), and "not allowed by
// ruleset" matches vlink.ErrNotAllowed.
type ReplyError struct {
	Version Version
	Code    byte
}

func (e *ReplyError) Error() string {
	return fmt.Sprintf("%s proxy refused: %s (reply code %d)", e.Version, replyText(e.Version, e.Code), e.Code)
}

// Is makes the error match ErrRefused and the sentinels of its code.
func (e *ReplyError) Is(target error) bool {
	if target == ErrRefused {
		return true
	}
	if e.Version != V5 {
		return false
	}
	switch e.Code {
	case rep5NotAllowed:
		return target == layer.ErrNotAllowed
	case rep5NetUnreachable:
		return target == layer.ErrUnreachable || target == syscall.ENETUNREACH
	case rep5HostUnreachable:
		return target == layer.ErrUnreachable || target == syscall.EHOSTUNREACH
	case rep5ConnRefused:
		return target == layer.ErrUnreachable || target == syscall.ECONNREFUSED
	case rep5TTLExpired:
		return target == layer.ErrUnreachable
	}
	return false
}

// DialContext connects to address through the proxy, which it reaches
// through forward (nil: a net.Dialer). The context bounds the whole
// setup, handshake included (layer.DefaultHandshakeTimeout if it sets no
// deadline).
func (f *Factory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	name := f.o.Version.String()
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, hop.Error("dial", name, f.o.Proxy, net.UnknownNetworkError(network))
	}
	host, port, err := splitDest(address)
	if err != nil {
		return nil, hop.Error("dial", name, f.o.Proxy, fmt.Errorf("destination %q: %w", address, err))
	}
	dst, err := f.dest(ctx, host, port)
	if err != nil {
		return nil, hop.Error("dial", name, f.o.Proxy, fmt.Errorf("destination %s: %w", address, err))
	}
	if forward == nil {
		forward = &net.Dialer{}
	}
	c, err := forward.DialContext(ctx, "tcp", f.o.Proxy)
	if err != nil {
		return nil, hop.Error("dial", name, f.o.Proxy, fmt.Errorf("reaching the proxy: %w", err))
	}
	err = hop.Handshake(ctx, c, func() error {
		if f.o.Version == V5 {
			return handshake5(c, dst, f.o.User, f.o.Password)
		}
		return handshake4(c, dst, f.o.User)
	})
	if err != nil {
		c.Close()
		return nil, hop.Error("dial", name, f.o.Proxy, fmt.Errorf("connect to %s: %w", address, err))
	}
	return c, nil
}

// A dest is a destination as the protocol carries it: an address, or a
// name for the proxy to resolve.
type dest struct {
	ip   netip.Addr // valid, or
	name string     // for the proxy to resolve
	port uint16
}

// dest turns host into what the version sends, resolving it here when
// the version or the options want that.
func (f *Factory) dest(ctx context.Context, host string, port uint16) (dest, error) {
	d := dest{port: port}
	if ip, err := netip.ParseAddr(host); err == nil {
		d.ip = ip.Unmap()
		if f.o.Version != V5 && !d.ip.Is4() {
			return d, fmt.Errorf("%s carries IPv4 addresses only", f.o.Version)
		}
		return d, nil
	}
	if len(host) > 255 {
		return d, errors.New("host name longer than 255 bytes")
	}
	switch {
	case f.o.Version == V4a, f.o.Version == V5 && !f.o.ResolveLocally:
		if err := checkName(host); err != nil {
			return d, err
		}
		d.name = host
		return d, nil
	}
	family := "ip"
	if f.o.Version == V4 {
		family = "ip4"
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, family, host)
	if err != nil {
		return d, err
	}
	if len(ips) == 0 {
		return d, fmt.Errorf("no %s address for %s", family, host)
	}
	d.ip = ips[0].Unmap()
	return d, nil
}

// checkName refuses names no resolver would take: they can only be an
// attempt to smuggle bytes into the proxy's request or logs.
func checkName(host string) error {
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("host name %q holds a control character or space", host)
		}
	}
	return nil
}

// splitDest splits host:port and checks the port.
func splitDest(address string) (string, uint16, error) {
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return "", 0, err
	}
	if host == "" {
		return "", 0, errors.New("no host")
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", ps)
	}
	return host, uint16(port), nil
}

// readFull reads exactly len(b) bytes; a proxy closing early is an
// unexpected EOF, not a clean end.
func readFull(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("reading the proxy's answer: %w", err)
	}
	return nil
}

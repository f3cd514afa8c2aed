// Package httpconnect is vlink's HTTP CONNECT factory: the "http" layer
// reaches the destination through an HTTP proxy's CONNECT method (RFC
// 9110 §9.3.6), with basic authentication. The proxy itself is reached
// through the layer below, so it chains with the other factories.
//
// The response is read with net/http's parser over a bounded window
// (MaxHeaderBytes): a proxy cannot make a dial hold more memory than
// that. Bytes the proxy sent after its response header are not lost: the
// connection returned replays them first, and still unwraps to the
// proxy's connection, so a relay takes the zero-copy path once they are
// drained.
//
// Importing the package registers the layer with package vlink.
package httpconnect

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/internal/secret"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// MaxHeaderBytes bounds the proxy's response header (status line
// included), as net/http's server bounds requests.
const MaxHeaderBytes = 64 << 10

func init() {
	layer.Register(layer.Spec{
		Name:    "http",
		Kind:    layer.KindFactory,
		Summary: "HTTP proxy client (CONNECT), with basic authentication",
		Params: []layer.Param{
			{Name: "addr", Type: layer.TypeString, Required: true, Hop: true,
				Doc: "the proxy's HOST:PORT, reached through the layer below"},
			{Name: "user", Type: layer.TypeString, Secret: true,
				Doc: "user name for basic authentication; needs password-file or password-env; shown nowhere, as a proxy URL's user-info"},
			{Name: "password-file", Type: layer.TypeString,
				Doc: "file holding the password (mode 600); never put a password in a stack"},
			{Name: "password-env", Type: layer.TypeString,
				Doc: "environment variable holding the password"},
			{Name: "password", Type: layer.TypeString, Secret: true,
				Doc: "the password itself, as a proxy URL gives it (http://user:password@host:3128); shown nowhere, but visible to other users in process listings: prefer password-file"},
		},
		New: func(a layer.Args) (any, error) {
			pw, err := secret.Password(a.String("password"), a.String("password-file"), a.String("password-env"))
			if err != nil {
				return nil, fmt.Errorf("%w: %w", layer.ErrBadParam, err)
			}
			return New(Options{Proxy: a.String("addr"), User: a.String("user"), Password: pw})
		},
	})
}

// Options configure a Factory.
type Options struct {
	// Proxy is the proxy's host:port.
	Proxy string
	// User and Password are sent with basic authentication when User is
	// set. The password is never printed.
	User, Password string
	// Header holds extra request header fields (a User-Agent, say).
	Header http.Header
}

// String describes the options with the password redacted.
func (o Options) String() string {
	s := "http proxy " + o.Proxy
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
	host, port, err := net.SplitHostPort(o.Proxy)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%w: addr=%q: want the proxy's HOST:PORT", layer.ErrBadParam, o.Proxy)
	}
	switch {
	case o.User != "" && o.Password == "":
		return fmt.Errorf("%w: a user without a password: give password-file or password-env", layer.ErrBadParam)
	case o.User == "" && o.Password != "":
		return fmt.Errorf("%w: a password without a user", layer.ErrBadParam)
	case strings.ContainsRune(o.User, ':'):
		return fmt.Errorf("%w: basic authentication forbids ':' in a user name", layer.ErrBadParam)
	case strings.ContainsAny(o.User+o.Password, "\r\n\x00"):
		return fmt.Errorf("%w: user and password cannot hold line breaks or NUL", layer.ErrBadParam)
	}
	return nil
}

// A Factory dials through an HTTP proxy. It implements layer.Factory and
// is safe for concurrent use.
type Factory struct {
	o    Options
	auth string // the Proxy-Authorization value, or ""
}

var _ layer.Factory = (*Factory)(nil)

// New returns a Factory for the options.
func New(o Options) (*Factory, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	f := &Factory{o: o}
	if o.User != "" {
		f.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(o.User+":"+o.Password))
	}
	return f, nil
}

// String describes the factory, password redacted.
func (f *Factory) String() string { return f.o.String() }

// Errors matched by a failed dial (with errors.Is). A refusal is a
// *StatusError, which also matches ErrRefused.
var (
	// ErrAuth: the proxy wants credentials (407) and we have none, or it
	// rejected ours. It matches vlink.ErrAuth too.
	ErrAuth = fmt.Errorf("http: proxy %w", layer.ErrAuth)
	// ErrRefused: the proxy answered CONNECT with a status other than
	// 2xx.
	ErrRefused = errors.New("http: proxy refused the destination")
	// ErrProtocol: the proxy's answer is not an HTTP response, or its
	// header is too large.
	ErrProtocol = errors.New("http: malformed answer from the proxy")
)

// A StatusError is a proxy's refusal of a CONNECT. It matches ErrRefused;
// ErrAuth for 407 (and 401, which tinyproxy sends for a wrong password);
// layer.ErrNotAllowed (which is vlink.ErrNotAllowed) for 403; and
// layer.ErrUnreachable for 502, 503 and 504 (how proxies report a
// destination they could not reach).
type StatusError struct {
	StatusCode int
	Status     string // as the proxy wrote it: "403 Forbidden"
}

func (e *StatusError) Error() string { return "http proxy answered " + strconv.Quote(e.Status) }

// isAuth reports a refusal for want of credentials: 407, or 401, which
// some proxies (tinyproxy) send for wrong ones.
func (e *StatusError) isAuth() bool {
	return e.StatusCode == http.StatusProxyAuthRequired || e.StatusCode == http.StatusUnauthorized
}

// Is makes the error match ErrRefused and the sentinels of its status.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrRefused:
		return true
	case ErrAuth, layer.ErrAuth:
		return e.isAuth()
	case layer.ErrNotAllowed:
		return e.StatusCode == http.StatusForbidden
	case layer.ErrUnreachable:
		return e.StatusCode == http.StatusBadGateway || e.StatusCode == http.StatusServiceUnavailable ||
			e.StatusCode == http.StatusGatewayTimeout
	}
	return false
}

// DialContext connects to address through the proxy, which it reaches
// through forward (nil: a net.Dialer). The context bounds the whole
// setup (layer.DefaultHandshakeTimeout if it sets no deadline).
func (f *Factory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, hop.Error("dial", "http", f.o.Proxy, net.UnknownNetworkError(network))
	}
	if err := checkAuthority(address); err != nil {
		return nil, hop.Error("dial", "http", f.o.Proxy, fmt.Errorf("destination %q: %w", address, err))
	}
	if forward == nil {
		forward = &net.Dialer{}
	}
	c, err := forward.DialContext(ctx, "tcp", f.o.Proxy)
	if err != nil {
		return nil, hop.Error("dial", "http", f.o.Proxy, fmt.Errorf("reaching the proxy: %w", err))
	}
	var rest []byte
	err = hop.Handshake(ctx, c, func() (err error) {
		rest, err = f.connect(c, address)
		return err
	})
	if err != nil {
		c.Close()
		return nil, hop.Error("dial", "http", f.o.Proxy, fmt.Errorf("CONNECT %s: %w", address, err))
	}
	if len(rest) > 0 {
		return netconn.Prefixed(c, rest), nil
	}
	return c, nil
}

// checkAuthority refuses destinations that are not a plain host:port:
// anything else could inject header lines into the request.
func checkAuthority(address string) error {
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host")
	}
	if p, err := strconv.ParseUint(ps, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", ps)
	}
	for i := 0; i < len(address); i++ {
		if c := address[i]; c <= ' ' || c == 0x7f || c == '/' || c == '?' || c == '#' || c == '@' {
			return fmt.Errorf("invalid character %q", c)
		}
	}
	return nil
}

// connect sends the CONNECT request and reads the response header. It
// returns the bytes read past the header, which belong to the tunnel.
func (f *Factory) connect(c net.Conn, address string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", address, address)
	if f.auth != "" {
		fmt.Fprintf(&b, "Proxy-Authorization: %s\r\n", f.auth)
	}
	for k, vs := range f.o.Header {
		for _, v := range vs {
			if strings.ContainsAny(k+v, "\r\n") {
				return nil, fmt.Errorf("header %q holds a line break", k)
			}
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, fmt.Errorf("sending the request: %w", err)
	}
	return readResponse(c)
}

// readResponse reads a CONNECT response header from r, never more than
// MaxHeaderBytes, and returns what was read past it.
func readResponse(r io.Reader) ([]byte, error) {
	lr := &io.LimitedReader{R: r, N: MaxHeaderBytes}
	br := bufio.NewReaderSize(lr, 4096)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		switch {
		case lr.N == 0:
			return nil, fmt.Errorf("%w: response header larger than %d bytes", ErrProtocol, MaxHeaderBytes)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("the proxy closed the connection before answering: %w", io.ErrUnexpectedEOF)
		}
		var ne net.Error
		if errors.As(err, &ne) {
			return nil, fmt.Errorf("reading the proxy's answer: %w", err)
		}
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if resp.StatusCode/100 != 2 {
		se := &StatusError{StatusCode: resp.StatusCode, Status: resp.Status}
		if se.isAuth() {
			return nil, fmt.Errorf("%w: %w", ErrAuth, se)
		}
		return nil, se
	}
	// A 2xx answer to CONNECT has no body: what follows is the tunnel.
	rest := make([]byte, br.Buffered())
	br.Read(rest)
	return rest, nil
}

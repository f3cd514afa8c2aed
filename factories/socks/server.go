package socks

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"

	"github.com/txthinking/socks5"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// A Server is the SOCKS front end of vlink socks: it takes SOCKS4, SOCKS4a
// and SOCKS5 CONNECT requests from clients and dials their destinations
// with Dialer, names unresolved, so a stack that reaches them through an
// SSH server or a proxy also resolves them there. With UDP set it serves
// SOCKS5 UDP ASSOCIATE too (see Association); BIND, and UDP ASSOCIATE
// without UDP, are answered "command not supported".
//
// SOCKS5 decoding uses github.com/txthinking/socks5's message decoders;
// its Server is not used (it listens by itself, dials directly, and after
// refusing a client's methods goes on with the handshake anyway).
//
// The zero value is not usable: Dialer is required.
type Server struct {
	// Dialer reaches the destinations.
	Dialer layer.ContextDialer
	// User and Password, if User is set, are required from every client
	// with SOCKS5 username/password authentication (RFC 1929); SOCKS4
	// clients, which cannot authenticate, are then refused.
	User, Password string
	// UDP, if set, serves SOCKS5 UDP ASSOCIATE: the datagrams go to their
	// destinations through Dialer, dialed with network "udp" (a
	// vlink.Dialer carries them through its route's gateway).
	UDP *UDPConfig
}

// A Request is what a client asked for.
type Request struct {
	Version Version
	// Dest is the destination as the client gave it: an address, or a
	// name to be resolved on the far side.
	Dest string
	// User is the SOCKS5 user name or SOCKS4 user id, if any.
	User string
	// Association is set for a UDP ASSOCIATE that was granted: Handshake
	// returns no connection, and the caller runs Association.Serve with
	// the client's connection.
	Association *Association
}

// Errors matched by a failed Handshake.
var (
	// ErrClientAuth: the client could not or did not authenticate.
	ErrClientAuth = errors.New("socks: client failed to authenticate")
	// ErrBadRequest: the client's bytes are not a SOCKS request we serve.
	ErrBadRequest = errors.New("socks: bad request from client")
)

// Handshake reads a SOCKS request from c, dials its destination with the
// Dialer, answers the client and returns the destination's connection,
// which the caller relays to c. On failure it has answered the client if
// the protocol has an answer for the failure, and returns the error; the
// caller closes c. ctx bounds the whole handshake, dial included
// (layer.DefaultHandshakeTimeout if it has no deadline), and each message
// is read with a bounded number of bytes.
func (s *Server) Handshake(ctx context.Context, c net.Conn) (net.Conn, *Request, error) {
	var out net.Conn
	req := &Request{}
	err := hop.Handshake(ctx, c, func() error {
		var first [1]byte
		if _, err := io.ReadFull(c, first[:]); err != nil {
			return fmt.Errorf("reading the version: %w", err)
		}
		var err error
		switch first[0] {
		case 5:
			req.Version = V5
			out, err = s.serve5(ctx, c, req)
		case 4:
			req.Version = V4
			out, err = s.serve4(ctx, c, req)
		default:
			return fmt.Errorf("%w: version byte %d (not SOCKS4 or SOCKS5)", ErrBadRequest, first[0])
		}
		return err
	})
	if err != nil {
		if out != nil {
			out.Close()
		}
		return nil, req, err
	}
	return out, req, nil
}

func (s *Server) serve5(ctx context.Context, c net.Conn, req *Request) (net.Conn, error) {
	nr, err := socks5.NewNegotiationRequestFrom(io.MultiReader(bytesReader{5}, c))
	if err != nil {
		return nil, clientError("greeting", err)
	}
	want := byte(socks5.MethodNone)
	if s.User != "" {
		want = socks5.MethodUsernamePassword
	}
	offered := false
	for _, m := range nr.Methods {
		offered = offered || m == want
	}
	if !offered {
		socks5.NewNegotiationReply(socks5.MethodUnsupportAll).WriteTo(c)
		if want == socks5.MethodUsernamePassword {
			return nil, fmt.Errorf("%w: a user name and password are required and the client offers none", ErrClientAuth)
		}
		return nil, fmt.Errorf("%w: the client insists on authentication this server does not do", ErrClientAuth)
	}
	if _, err := socks5.NewNegotiationReply(want).WriteTo(c); err != nil {
		return nil, err
	}
	if want == socks5.MethodUsernamePassword {
		ur, err := socks5.NewUserPassNegotiationRequestFrom(c)
		if err != nil {
			return nil, clientError("credentials", err)
		}
		req.User = string(ur.Uname)
		userOK := subtle.ConstantTimeCompare(ur.Uname, []byte(s.User))
		pwOK := subtle.ConstantTimeCompare(ur.Passwd, []byte(s.Password))
		if userOK&pwOK != 1 {
			socks5.NewUserPassNegotiationReply(socks5.UserPassStatusFailure).WriteTo(c)
			return nil, fmt.Errorf("%w: wrong user name or password (user %q)", ErrClientAuth, req.User)
		}
		if _, err := socks5.NewUserPassNegotiationReply(socks5.UserPassStatusSuccess).WriteTo(c); err != nil {
			return nil, err
		}
	}
	r, err := socks5.NewRequestFrom(c)
	if err != nil {
		if errors.Is(err, socks5.ErrBadRequest) {
			reply5(c, rep5AddrNotSupported, nil)
		}
		return nil, clientError("request", err)
	}
	port := binary.BigEndian.Uint16(r.DstPort)
	switch r.Atyp {
	case socks5.ATYPDomain:
		name := string(r.DstAddr[1:])
		if err := checkName(name); err != nil {
			reply5(c, rep5AddrNotSupported, nil)
			return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		req.Dest = net.JoinHostPort(name, strconv.Itoa(int(port)))
	default: // the decoder only returns IPv4 and IPv6 otherwise
		ip, _ := netip.AddrFromSlice(r.DstAddr)
		req.Dest = netip.AddrPortFrom(ip.Unmap(), port).String()
	}
	if r.Cmd == socks5.CmdUDP && s.UDP != nil {
		a, err := s.associate(c, port)
		if err != nil {
			reply5(c, rep5GeneralFailure, nil)
			return nil, err
		}
		if err := reply5(c, socks5.RepSuccess, a.Addr()); err != nil {
			a.pc.Close()
			return nil, err
		}
		req.Association = a
		return nil, nil
	}
	if r.Cmd != socks5.CmdConnect {
		reply5(c, rep5CmdNotSupported, nil)
		if r.Cmd == socks5.CmdUDP {
			return nil, fmt.Errorf("%w: UDP ASSOCIATE is not served here", ErrBadRequest)
		}
		return nil, fmt.Errorf("%w: command %d (only CONNECT is served)", ErrBadRequest, r.Cmd)
	}
	out, err := s.Dialer.DialContext(ctx, "tcp", req.Dest)
	if err != nil {
		reply5(c, replyCode5(err), nil)
		return nil, err
	}
	if err := reply5(c, socks5.RepSuccess, out.LocalAddr()); err != nil {
		return out, err
	}
	return out, nil
}

// reply5 answers a SOCKS5 request, with the bound address if it is an IP.
func reply5(c net.Conn, code byte, bound net.Addr) error {
	ip, port := netip.IPv4Unspecified(), uint16(0)
	switch a := bound.(type) {
	case *net.TCPAddr:
		ap := a.AddrPort()
		ip, port = ap.Addr().Unmap(), ap.Port()
	case *net.UDPAddr:
		ap := a.AddrPort()
		ip, port = ap.Addr().Unmap(), ap.Port()
	}
	atyp, addr := socks5.ATYPIPv4, ip.AsSlice()
	if ip.Is6() {
		atyp = socks5.ATYPIPv6
	}
	_, err := socks5.NewReply(code, atyp, addr, portBytes(port)).WriteTo(c)
	return err
}

// replyCode5 turns a dial error into the SOCKS5 reply that tells it best.
func replyCode5(err error) byte {
	var re *ReplyError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &re) && re.Version == V5:
		return re.Code // the next proxy's own answer
	case errors.Is(err, layer.ErrDirectRefused), errors.Is(err, layer.ErrNotAllowed):
		return rep5NotAllowed
	case errors.Is(err, syscall.ECONNREFUSED):
		return rep5ConnRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return rep5NetUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.As(err, &dnsErr), errors.Is(err, layer.ErrUnreachable):
		return rep5HostUnreachable
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return rep5TTLExpired
	}
	return rep5GeneralFailure
}

func (s *Server) serve4(ctx context.Context, c net.Conn, req *Request) (net.Conn, error) {
	r, err := readRequest4(io.MultiReader(bytesReader{4}, c))
	if err != nil {
		return nil, err
	}
	req.User = r.user
	if r.d.name != "" {
		req.Version = V4a
		req.Dest = net.JoinHostPort(r.d.name, strconv.Itoa(int(r.d.port)))
	} else {
		req.Dest = netip.AddrPortFrom(r.d.ip, r.d.port).String()
	}
	if s.User != "" {
		reply4(c, rep4Rejected)
		return nil, fmt.Errorf("%w: %s cannot authenticate and this server requires a password", ErrClientAuth, req.Version)
	}
	if r.cmd != cmd4Connect {
		reply4(c, rep4Rejected)
		return nil, fmt.Errorf("%w: command %d (only CONNECT is served)", ErrBadRequest, r.cmd)
	}
	out, err := s.Dialer.DialContext(ctx, "tcp", req.Dest)
	if err != nil {
		reply4(c, rep4Rejected)
		return nil, err
	}
	return out, reply4(c, rep4Granted)
}

func reply4(c net.Conn, code byte) error {
	_, err := c.Write([]byte{0, code, 0, 0, 0, 0, 0, 0})
	return err
}

// A request4 is a decoded SOCKS4 or SOCKS4a request.
type request4 struct {
	cmd  byte
	d    dest
	user string
}

// readRequest4 decodes a SOCKS4 or SOCKS4a request, reading exactly its
// bytes (a client may send data right behind it) and at most
// maxUserID+1 bytes for each of the user id and the name.
func readRequest4(r io.Reader) (request4, error) {
	var req request4
	var h [8]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return req, clientError("request", err)
	}
	if h[0] != ver4 {
		return req, fmt.Errorf("%w: version %d", ErrBadRequest, h[0])
	}
	req.cmd = h[1]
	req.d.port = binary.BigEndian.Uint16(h[2:4])
	req.d.ip = netip.AddrFrom4([4]byte(h[4:8]))
	user, err := readString(r, "user id")
	if err != nil {
		return req, err
	}
	req.user = user
	if h[4] == 0 && h[5] == 0 && h[6] == 0 && h[7] != 0 { // 0.0.0.x: SOCKS4a, a name follows
		name, err := readString(r, "host name")
		if err != nil {
			return req, err
		}
		if name == "" {
			return req, fmt.Errorf("%w: empty host name", ErrBadRequest)
		}
		if err := checkName(name); err != nil {
			return req, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		req.d.name = name
	}
	return req, nil
}

// readString reads a NUL-terminated string of at most maxUserID bytes,
// one byte at a time so nothing past it is consumed.
func readString(r io.Reader, what string) (string, error) {
	var b [maxUserID + 1]byte
	for n := 0; n < len(b); n++ {
		if _, err := io.ReadFull(r, b[n:n+1]); err != nil {
			return "", clientError(what, err)
		}
		if b[n] == 0 {
			return string(b[:n]), nil
		}
	}
	return "", fmt.Errorf("%w: %s longer than %d bytes", ErrBadRequest, what, maxUserID)
}

// clientError classifies a failure to read a client's message.
func clientError(what string, err error) error {
	switch {
	case errors.Is(err, socks5.ErrVersion), errors.Is(err, socks5.ErrUserPassVersion), errors.Is(err, socks5.ErrBadRequest):
		return fmt.Errorf("%w: %s: %w", ErrBadRequest, what, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the client closed the connection in its %s: %w", what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("reading the client's %s: %w", what, err)
}

// bytesReader puts back the version byte Handshake read to choose the
// protocol.
type bytesReader struct{ b byte }

func (r bytesReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.b
	return 1, io.EOF
}

package socks

import (
	"errors"
	"fmt"
	"io"

	"github.com/txthinking/socks5"
)

// SOCKS5 reply codes (RFC 1928 §6).
const (
	rep5GeneralFailure   = socks5.RepServerFailure
	rep5NotAllowed       = socks5.RepNotAllowed
	rep5NetUnreachable   = socks5.RepNetworkUnreachable
	rep5HostUnreachable  = socks5.RepHostUnreachable
	rep5ConnRefused      = socks5.RepConnectionRefused
	rep5TTLExpired       = socks5.RepTTLExpired
	rep5CmdNotSupported  = socks5.RepCommandNotSupported
	rep5AddrNotSupported = socks5.RepAddressNotSupported
)

// handshake5 negotiates a method (none, or username/password when we have
// credentials), authenticates, and asks the proxy to CONNECT to d. The
// message types and their decoders are github.com/txthinking/socks5's;
// each reads a bounded number of bytes (a reply's name is at most 255).
func handshake5(rw io.ReadWriter, d dest, user, password string) error {
	methods := []byte{socks5.MethodNone}
	if user != "" {
		methods = append(methods, socks5.MethodUsernamePassword)
	}
	if _, err := socks5.NewNegotiationRequest(methods).WriteTo(rw); err != nil {
		return fmt.Errorf("sending the greeting: %w", err)
	}
	nr, err := socks5.NewNegotiationReplyFrom(rw)
	if err != nil {
		return answerError("greeting", err)
	}
	switch nr.Method {
	case socks5.MethodNone:
	case socks5.MethodUsernamePassword:
		if user == "" {
			return fmt.Errorf("%w: the proxy requires a user name and password (give user and password-file)", ErrAuth)
		}
		if _, err := socks5.NewUserPassNegotiationRequest([]byte(user), []byte(password)).WriteTo(rw); err != nil {
			return fmt.Errorf("sending the credentials: %w", err)
		}
		ur, err := socks5.NewUserPassNegotiationReplyFrom(rw)
		if err != nil {
			return answerError("authentication", err)
		}
		if ur.Status != socks5.UserPassStatusSuccess {
			return fmt.Errorf("%w: the user name and password were rejected", ErrAuth)
		}
	case socks5.MethodUnsupportAll:
		if user == "" {
			return fmt.Errorf("%w: the proxy accepts no method we offer (none); it may want a user and password", ErrAuth)
		}
		return fmt.Errorf("%w: the proxy accepts no method we offer (none, username/password)", ErrAuth)
	default:
		return fmt.Errorf("%w: the proxy chose method %d, which we did not offer", ErrProtocol, nr.Method)
	}

	var req *socks5.Request
	switch {
	case d.name != "":
		req = socks5.NewRequest(socks5.CmdConnect, socks5.ATYPDomain, []byte(d.name), portBytes(d.port))
	case d.ip.Is4():
		ip := d.ip.As4()
		req = socks5.NewRequest(socks5.CmdConnect, socks5.ATYPIPv4, ip[:], portBytes(d.port))
	default:
		ip := d.ip.As16()
		req = socks5.NewRequest(socks5.CmdConnect, socks5.ATYPIPv6, ip[:], portBytes(d.port))
	}
	if _, err := req.WriteTo(rw); err != nil {
		return fmt.Errorf("sending the request: %w", err)
	}
	rep, err := socks5.NewReplyFrom(rw)
	if err != nil {
		return answerError("reply", err)
	}
	if rep.Rep != socks5.RepSuccess {
		return &ReplyError{Version: V5, Code: rep.Rep}
	}
	return nil
}

func portBytes(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

// answerError classifies a failure to read one of the proxy's messages:
// the library's decoding errors are a protocol error, an early close is
// an unexpected EOF, and anything else (a deadline, a reset) is kept.
func answerError(what string, err error) error {
	switch {
	case errors.Is(err, socks5.ErrVersion), errors.Is(err, socks5.ErrUserPassVersion), errors.Is(err, socks5.ErrBadReply):
		return fmt.Errorf("%w: %s: %w (is it a SOCKS5 proxy?)", ErrProtocol, what, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the proxy closed the connection before its %s: %w", what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("reading the proxy's %s: %w", what, err)
}

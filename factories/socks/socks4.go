package socks

import (
	"encoding/binary"
	"fmt"
	"io"
)

// SOCKS4 and SOCKS4a messages (the SOCKS4 protocol note; the 4a
// extension): the request is VN CD DSTPORT DSTIP USERID NUL [HOST NUL],
// the reply VN CD DSTPORT DSTIP.
const (
	ver4          = 4
	cmd4Connect   = 1
	reply4Size    = 8
	maxUserID     = 255 // our bound: the protocol has none
	rep4Granted   = 90
	rep4Rejected  = 91
	rep4NoIdentd  = 92
	rep4BadIdentd = 93
)

// appendRequest4 encodes a CONNECT request. A destination given by name
// (SOCKS4a) carries the invalid address 0.0.0.1 and the name after the
// user id.
func appendRequest4(b []byte, d dest, user string) []byte {
	b = append(b, ver4, cmd4Connect)
	b = binary.BigEndian.AppendUint16(b, d.port)
	if d.name != "" {
		b = append(b, 0, 0, 0, 1)
	} else {
		ip := d.ip.As4()
		b = append(b, ip[:]...)
	}
	b = append(b, user...)
	b = append(b, 0)
	if d.name != "" {
		b = append(b, d.name...)
		b = append(b, 0)
	}
	return b
}

// parseReply4 decodes a reply: nil if the proxy granted the request, a
// *ReplyError if it refused it, an ErrProtocol error if the bytes are not
// a SOCKS4 reply. The reply's version byte is 0 by the protocol; some
// servers echo 4, which is accepted too.
func parseReply4(b [reply4Size]byte) error {
	if b[0] != 0 && b[0] != ver4 {
		return fmt.Errorf("%w: reply version %d, want 0 (is it a SOCKS4 proxy?)", ErrProtocol, b[0])
	}
	switch b[1] {
	case rep4Granted:
		return nil
	case rep4Rejected, rep4NoIdentd, rep4BadIdentd:
		return &ReplyError{Version: V4, Code: b[1]}
	}
	return fmt.Errorf("%w: unknown SOCKS4 reply code %d", ErrProtocol, b[1])
}

// handshake4 asks the proxy to connect to d and reads its answer.
func handshake4(rw io.ReadWriter, d dest, user string) error {
	if _, err := rw.Write(appendRequest4(make([]byte, 0, 16+len(user)+len(d.name)), d, user)); err != nil {
		return fmt.Errorf("sending the request: %w", err)
	}
	var reply [reply4Size]byte
	if err := readFull(rw, reply[:]); err != nil {
		return err
	}
	return parseReply4(reply)
}

func replyText(v Version, code byte) string {
	if v != V5 {
		switch code {
		case rep4Rejected:
			return "request rejected or failed"
		case rep4NoIdentd:
			return "rejected: the proxy cannot reach our identd"
		case rep4BadIdentd:
			return "rejected: identd reports another user id"
		}
		return "unknown code"
	}
	switch code {
	case rep5GeneralFailure:
		return "general failure"
	case rep5NotAllowed:
		return "connection not allowed by ruleset"
	case rep5NetUnreachable:
		return "network unreachable"
	case rep5HostUnreachable:
		return "host unreachable"
	case rep5ConnRefused:
		return "connection refused"
	case rep5TTLExpired:
		return "TTL expired"
	case rep5CmdNotSupported:
		return "command not supported"
	case rep5AddrNotSupported:
		return "address type not supported"
	}
	return "unknown code"
}

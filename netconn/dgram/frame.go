// Package dgram carries datagrams whole over a reliable byte stream, and
// gives UDP's own shapes to what carries them: a Conn reads and writes one
// datagram per call, as a connected UDP socket does; a Listener turns the
// clients of one UDP socket into connections, one per source address, as
// a NAT's mappings do; Relay copies datagrams between two such
// connections until one ends or the session falls idle.
//
// On a stream every datagram arrives, in order, or the stream fails: a
// datagram is lost only where a queue in front of the stream is full (a
// Listener's, see ListenConfig.Queue), never in the middle, and a slow
// stream delays the datagrams behind it rather than losing them.
// NewConnOver adds an unreliable carrier beside the stream (QUIC
// datagrams): the datagrams that fit it may then be lost, alone, and
// delay no other.
package dgram

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Wire format: each datagram, and each error the far side's socket
// reported, is one frame:
//
//	frame = type u8 | length u16 | body
//
// The length is big-endian and counts the body only.
const (
	HeaderSize = 3
	// MaxDatagram is the largest datagram a frame carries: the most a
	// UDP payload can hold. A larger one is refused with EMSGSIZE, as
	// the kernel refuses it.
	MaxDatagram = 1<<16 - 1
)

type frameType uint8

const (
	frameData  frameType = 1 // body: one datagram, possibly empty
	frameError frameType = 2 // body: one byte, an errorCode the far socket reported
)

// header is a frame header.
type header [HeaderSize]byte

func (h header) Type() frameType { return frameType(h[0]) }
func (h header) Len() int        { return int(binary.BigEndian.Uint16(h[1:])) }

func makeHeader(t frameType, n int) header {
	var h header
	h[0] = byte(t)
	binary.BigEndian.PutUint16(h[1:], uint16(n))
	return h
}

// An errorCode is an error a UDP socket reports for an ICMP message, as
// the other side of the stream carries it. Only these cross: each is
// what the program would see from its own socket without vlink.
type errorCode uint8

const (
	codeRefused     errorCode = 1 // ECONNREFUSED: port unreachable
	codeHostUnreach errorCode = 2 // EHOSTUNREACH
	codeNetUnreach  errorCode = 3 // ENETUNREACH
	codeTooBig      errorCode = 4 // EMSGSIZE: the path's MTU, or a datagram too large
)

var codes = []struct {
	code  errorCode
	errno syscall.Errno
}{
	{codeRefused, syscall.ECONNREFUSED},
	{codeHostUnreach, syscall.EHOSTUNREACH},
	{codeNetUnreach, syscall.ENETUNREACH},
	{codeTooBig, syscall.EMSGSIZE},
}

// codeOf returns the code of a socket error that crosses, and whether it
// is one.
func codeOf(err error) (errorCode, bool) {
	for _, c := range codes {
		if errors.Is(err, c.errno) {
			return c.code, true
		}
	}
	return 0, false
}

func (c errorCode) errno() (syscall.Errno, bool) {
	for _, k := range codes {
		if k.code == c {
			return k.errno, true
		}
	}
	return 0, false
}

// ErrMalformed is matched by the error of a stream whose frames cannot be
// read: an unknown frame type, an error frame of the wrong size or with
// an unknown code. The stream cannot be trusted further, and the Conn
// fails for good.
var ErrMalformed = errors.New("dgram: malformed frame")

// checkHeader checks a frame header, and returns the error code of an
// error frame once its body is known.
func checkHeader(h header) error {
	switch h.Type() {
	case frameData:
		return nil
	case frameError:
		if h.Len() != 1 {
			return fmt.Errorf("%w: error frame of %d bytes, want 1", ErrMalformed, h.Len())
		}
		return nil
	}
	return fmt.Errorf("%w: frame type %d", ErrMalformed, h[0])
}

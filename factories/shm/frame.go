package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The unix socket a connection is set up on carries, besides the
// shared memory's descriptors, two kinds of messages, integers
// big-endian:
//
//	hello = magic [8]byte | ring size u32    (dialer, with 5 descriptors)
//	reply = status u8                        (listener: 0 accepted)
//	ctl   = op u8 | n u64                    (either side, afterwards)
//
// The ctl ops are the end of what a side sends (fin, with its byte
// count, so the peer can tell a whole stream from a cut one) and an
// abort (rst).
const (
	helloSize = 12
	ctlSize   = 9
	numFds    = 5 // the memory, then the data and room bells of ring 0 and ring 1
)

var magic = [8]byte{'v', 'l', 'i', 'n', 'k', 's', 'h', 1}

// errProtocol: the peer sent what the protocol does not allow.
var errProtocol = errors.New("shm: protocol error")

type op uint8

const (
	opFin op = 1
	opRst op = 2
)

type ctlMsg struct {
	op op
	n  uint64
}

func writeCtl(w io.Writer, m ctlMsg) error {
	var b [ctlSize]byte
	b[0] = byte(m.op)
	binary.BigEndian.PutUint64(b[1:], m.n)
	_, err := w.Write(b[:])
	return err
}

// readCtl reads one control message; an unknown op, or an abort with a
// count, is errProtocol.
func readCtl(r io.Reader) (ctlMsg, error) {
	var b [ctlSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return ctlMsg{}, err
	}
	m := ctlMsg{op: op(b[0]), n: binary.BigEndian.Uint64(b[1:])}
	switch {
	case m.op == opFin:
	case m.op == opRst && m.n == 0:
	default:
		return ctlMsg{}, fmt.Errorf("%w: control message %x", errProtocol, b)
	}
	return m, nil
}

func encodeHello(size int) []byte {
	b := append([]byte(nil), magic[:]...)
	return binary.BigEndian.AppendUint32(b, uint32(size))
}

// decodeHello returns the ring size a hello asks for.
func decodeHello(b []byte) (int, error) {
	if len(b) != helloSize || [8]byte(b[:8]) != magic {
		return 0, fmt.Errorf("%w: not a vlink shm hello (%d bytes)", errProtocol, len(b))
	}
	size := int(binary.BigEndian.Uint32(b[8:]))
	if !validSize(size) {
		return 0, fmt.Errorf("%w: a ring of %d bytes: want a power of two from %d to %d", errProtocol, size, minRingSize, maxRingSize)
	}
	return size, nil
}

// mappingSize is the size of the shared memory of two rings of size.
func mappingSize(size int) int { return 2 * (ringHeader + size) }

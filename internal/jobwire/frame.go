// Package jobwire is the protocol between vlink launch and the worker
// agents it starts on other machines (vlink launch --worker): the agent
// says hello, the launcher assigns it a rank and gives it what the
// worker needs to join the job's network, the agent sends back the
// worker's output and its exit, and the launcher may send signals. The
// stream under it is already private: an SSH session's standard input
// and output, or a connection encrypted and authenticated with the job's
// secret.
//
// Everything that arrives is untrusted: frames are bounded (MaxPayload)
// and decoded strictly, and a malformed one is an error for the stream
// that carried it.
package jobwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Wire format, integers big-endian:
//
//	frame  = type u8 | length u32 | payload
//	hello  = version u8 | len u8 | host | task u32 (version 2)
//	assign = rank u32 | size u32 | len u8 | relay | len u8 | key | count u16 | (len u16 | NAME=VALUE)*
//	output = the bytes (stdout and stderr frames)
//	exit   = code u8 | signal u8
//	signal = signal u8
//	stdin  = the bytes; none: the end of the input
const (
	Version    = 2
	headerSize = 5
	// MaxPayload bounds a frame's payload, and so what a peer can make
	// the other side allocate for one frame.
	MaxPayload = 64 << 10
	maxField   = 255
)

// Type is a frame's type.
type Type uint8

const (
	TypeHello  Type = 1 // agent: its protocol version and host name
	TypeAssign Type = 2 // launcher: the worker's rank and how to join
	TypeStdout Type = 3 // agent: the worker wrote this to its standard output
	TypeStderr Type = 4 // agent: ... to its standard error
	TypeExit   Type = 5 // agent: the worker ended (its last frame)
	TypeSignal Type = 6 // launcher: signal the worker's process group
	TypeStdin  Type = 7 // launcher: bytes for the worker's standard input; empty: its end
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "hello"
	case TypeAssign:
		return "assign"
	case TypeStdout:
		return "stdout"
	case TypeStderr:
		return "stderr"
	case TypeExit:
		return "exit"
	case TypeSignal:
		return "signal"
	case TypeStdin:
		return "stdin"
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// ErrFrame is a malformed frame: errors.Is finds it in every decoding
// error.
var ErrFrame = errors.New("jobwire: malformed frame")

type header [headerSize]byte

func (h *header) typ() Type      { return Type(h[0]) }
func (h *header) length() uint32 { return binary.BigEndian.Uint32(h[1:]) }

// A Frame is one frame read from the stream.
type Frame struct {
	Type    Type
	Payload []byte
}

// ReadFrame reads one frame. A stream that ends between frames returns
// io.EOF; one that ends inside a frame, io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader) (Frame, error) {
	var h header
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	if h.typ() < TypeHello || h.typ() > TypeStdin {
		return Frame{}, fmt.Errorf("%w: unknown %v", ErrFrame, h.typ())
	}
	n := h.length()
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: %v of %d bytes, at most %d", ErrFrame, h.typ(), n, MaxPayload)
	}
	f := Frame{Type: h.typ(), Payload: make([]byte, n)}
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
}

// WriteFrame writes one frame; payloads longer than MaxPayload are the
// caller's mistake.
func WriteFrame(w io.Writer, t Type, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("jobwire: %v payload of %d bytes, at most %d", t, len(payload), MaxPayload)
	}
	b := make([]byte, headerSize, headerSize+len(payload))
	b[0] = byte(t)
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	_, err := w.Write(append(b, payload...))
	return err
}

// Hello is the agent's first frame.
type Hello struct {
	Version uint8
	Host    string // the machine's name, for messages
	// Task is the worker's place as the scheduler that started it
	// numbered it, plus one (SLURM_PROCID+1): vlink launch gives it that
	// rank if it can. 0: none.
	Task uint32
}

func (h Hello) Encode() []byte {
	return binary.BigEndian.AppendUint32(appendField(append([]byte(nil), h.Version), h.Host), h.Task)
}

// DecodeHello decodes a hello. A hello of another version decodes to
// its version alone, for the launcher to say which.
func DecodeHello(p []byte) (Hello, error) {
	d := decoder{p: p}
	h := Hello{Version: d.u8()}
	if !d.short && h.Version != Version {
		return Hello{Version: h.Version}, nil
	}
	h.Host, h.Task = d.field(), d.u32()
	return h, d.end(TypeHello)
}

// Assign is the launcher's answer to a hello: the worker's place in the
// job. Key is the worker's node key, the only secret it is given.
type Assign struct {
	Rank, Size uint32
	Relay      string // the job's relay, host:port as the agent's machine reaches it
	Key        []byte
	// Env is what the worker's environment gets besides the agent's:
	// NAME=VALUE entries (vlink launch -x).
	Env []string
}

// MaxEnv bounds the size of an assignment's environment, so that it fits
// in a frame.
const MaxEnv = 32 << 10

func (a Assign) Encode() []byte {
	b := binary.BigEndian.AppendUint32(nil, a.Rank)
	b = binary.BigEndian.AppendUint32(b, a.Size)
	b = appendField(appendField(b, a.Relay), string(a.Key))
	b = binary.BigEndian.AppendUint16(b, uint16(len(a.Env)))
	for _, kv := range a.Env {
		b = binary.BigEndian.AppendUint16(b, uint16(len(kv)))
		b = append(b, kv...)
	}
	return b
}

func DecodeAssign(p []byte) (Assign, error) {
	d := decoder{p: p}
	a := Assign{Rank: d.u32(), Size: d.u32(), Relay: d.field(), Key: []byte(d.field())}
	n := int(d.u16())
	size := 0
	for range n {
		kv := string(d.take(int(d.u16())))
		if d.short {
			break
		}
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsRune(kv, 0) {
			return a, fmt.Errorf("%w: assign: environment entry %q is not NAME=VALUE", ErrFrame, kv)
		}
		if size += len(kv); size > MaxEnv {
			return a, fmt.Errorf("%w: assign: an environment of more than %d bytes", ErrFrame, MaxEnv)
		}
		a.Env = append(a.Env, kv)
	}
	if err := d.end(TypeAssign); err != nil {
		return a, err
	}
	if a.Size == 0 || a.Rank >= a.Size {
		return a, fmt.Errorf("%w: assign: rank %d of a job of %d", ErrFrame, a.Rank, a.Size)
	}
	return a, nil
}

// Exit is how the worker ended: Signal is the signal that killed it, or
// 0 when it exited with Code.
type Exit struct {
	Code, Signal uint8
}

func (e Exit) Encode() []byte { return []byte{e.Code, e.Signal} }

func DecodeExit(p []byte) (Exit, error) {
	d := decoder{p: p}
	e := Exit{Code: d.u8(), Signal: d.u8()}
	return e, d.end(TypeExit)
}

// DecodeSignal decodes a signal frame: a signal number, 1 to 64.
func DecodeSignal(p []byte) (uint8, error) {
	d := decoder{p: p}
	s := d.u8()
	if err := d.end(TypeSignal); err != nil {
		return 0, err
	}
	if s == 0 || s > 64 {
		return 0, fmt.Errorf("%w: signal %d", ErrFrame, s)
	}
	return s, nil
}

func appendField(b []byte, s string) []byte {
	if len(s) > maxField {
		s = s[:maxField] // a host name or relay address that long is not ours
	}
	return append(append(b, byte(len(s))), s...)
}

// decoder reads fields off a payload, remembering the first shortfall.
type decoder struct {
	p     []byte
	short bool
}

func (d *decoder) take(n int) []byte {
	if d.short || len(d.p) < n {
		d.short = true
		return make([]byte, n)
	}
	b := d.p[:n]
	d.p = d.p[n:]
	return b
}

func (d *decoder) u8() uint8   { return d.take(1)[0] }
func (d *decoder) u16() uint16 { return binary.BigEndian.Uint16(d.take(2)) }
func (d *decoder) u32() uint32 { return binary.BigEndian.Uint32(d.take(4)) }

func (d *decoder) field() string {
	n := int(d.u8())
	if d.short {
		return ""
	}
	return string(d.take(n))
}

func (d *decoder) end(t Type) error {
	switch {
	case d.short:
		return fmt.Errorf("%w: %v: short", ErrFrame, t)
	case len(d.p) > 0:
		return fmt.Errorf("%w: %v: %d bytes left over", ErrFrame, t, len(d.p))
	}
	return nil
}

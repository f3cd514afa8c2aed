package preload

import (
	"encoding/binary"
)

// A recipe lets the shim make a connect to one destination by itself, as
// the agent made it, with no round trip to the agent. The agent sends one
// (msgRecipe) after the descriptor of a blocking connect, or after a
// resultDirect to a non-blocking connect from a socket that can take it
// (modeFlagOwn), flagged resultFlagRecipe, when the connect's route is
// one of these:
//
//   - `tcp` through a gateway that takes a hello with no key
//     (gatewayFactory): for the next blocking connect there, the shim sets
//     the options on the program's socket where the program set none of its
//     own, connects it to the gateway, sends the hello and reads the
//     answer: exactly accept, or it shows the agent what came (msgAnswer)
//     for the errno, and replaces the socket with a fresh one;
//   - `tcp` with options and no gateway (plainFactory): a direct recipe,
//     with no hello and no accept. For this connect (after resultDirect)
//     and the next ones there, blocking or not, the shim sets the options
//     the same way and lets the program's connect go to the destination:
//     the kernel's answer is the program's, as without the shim.
//
// On the wire:
//
//	recipe = gateway addr | wait u32 | nopts u8 | opt*nopts | hello len u16 | hello | accept len u8 | accept
//	opt    = level u16 | name u16 | kind u8 | len u8 | value
//
// wait is how long, in milliseconds, the hello asks the gateway to wait
// for the target, and the shim waits for the answer. A direct recipe has
// both lengths 0, wait 0, and the destination itself as its gateway (the
// shim connects to the program's own address). An option of kind optInt
// is a big-endian int32 (len 4) set as an int; one of optBytes is set as
// its bytes (TCP_CONGESTION's name).
type recipe struct {
	gateway sockAddr
	waitMs  uint32
	opts    []recipeOpt
	hello   []byte
	accept  []byte
}

type recipeOpt struct {
	level, name uint16
	kind        uint8
	val         []byte
}

// Option kinds, and the shim's limits.
const (
	optInt   = 1
	optBytes = 2

	maxRecipeOpts   = 8
	maxOptValue     = 16
	maxRecipeHello  = 256
	maxRecipeAccept = 32
)

// direct reports whether r is a direct recipe: no hello and no accept.
func (r *recipe) direct() bool { return len(r.hello) == 0 && len(r.accept) == 0 }

// append encodes r as a msgRecipe body; false if it would not fit the
// shim's limits (the agent then sends none).
func (r *recipe) append(b []byte) ([]byte, bool) {
	if len(r.opts) > maxRecipeOpts || len(r.hello) > maxRecipeHello || len(r.accept) > maxRecipeAccept ||
		!r.direct() && (len(r.hello) == 0 || len(r.accept) == 0) {
		return b, false
	}
	b = appendAddr(b, r.gateway)
	b = binary.BigEndian.AppendUint32(b, r.waitMs)
	b = append(b, byte(len(r.opts)))
	for _, o := range r.opts {
		if len(o.val) > maxOptValue || o.kind == optInt && len(o.val) != 4 || o.kind != optInt && o.kind != optBytes {
			return b, false
		}
		b = binary.BigEndian.AppendUint16(b, o.level)
		b = binary.BigEndian.AppendUint16(b, o.name)
		b = append(b, o.kind, byte(len(o.val)))
		b = append(b, o.val...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.hello)))
	b = append(b, r.hello...)
	b = append(b, byte(len(r.accept)))
	return append(b, r.accept...), true
}

// parseRecipe decodes a msgRecipe body as the shim does, with the same
// limits: for tests.
func parseRecipe(b []byte) (recipe, error) {
	var r recipe
	var err error
	if r.gateway, err = parseAddr(b); err != nil {
		return r, err
	}
	b = b[addrSize:]
	if len(b) < 5 {
		return r, badFrame("recipe cut short")
	}
	r.waitMs = binary.BigEndian.Uint32(b)
	n := int(b[4])
	b = b[5:]
	if n > maxRecipeOpts {
		return r, badFrame("recipe of %d options", n)
	}
	for range n {
		if len(b) < 6 || len(b) < 6+int(b[5]) {
			return r, badFrame("recipe option cut short")
		}
		o := recipeOpt{level: binary.BigEndian.Uint16(b), name: binary.BigEndian.Uint16(b[2:]), kind: b[4], val: b[6 : 6+int(b[5])]}
		if len(o.val) > maxOptValue || o.kind == optInt && len(o.val) != 4 || o.kind != optInt && o.kind != optBytes {
			return r, badFrame("recipe option of kind %d, %d bytes", o.kind, len(o.val))
		}
		r.opts = append(r.opts, o)
		b = b[6+len(o.val):]
	}
	if len(b) < 2 {
		return r, badFrame("recipe cut short")
	}
	h := int(binary.BigEndian.Uint16(b))
	if h > maxRecipeHello || len(b) < 2+h+1 {
		return r, badFrame("recipe hello of %d bytes", h)
	}
	r.hello, b = b[2:2+h], b[2+h:]
	a := int(b[0])
	if a > maxRecipeAccept || len(b) != 1+a {
		return r, badFrame("recipe accept of %d bytes, %d left", a, len(b)-1)
	}
	if (h == 0) != (a == 0) {
		return r, badFrame("recipe with a hello of %d bytes and an accept of %d: both or neither", h, a)
	}
	r.accept = b[1:]
	return r, nil
}

// answerReq shows the agent what a recipe's gateway answered instead of
// the accept: at most maxAnswer bytes, and whether the wait ran out
// first. The agent replies msgErrno: the errno of the refusal it carries,
// or 0 if it is none (the shim then asks the agent to connect).
type answerReq struct {
	dest     sockAddr
	timedOut bool
	n        uint16
	b        [maxAnswer]byte
}

const maxAnswer = 256

func (m *answerReq) bytes() []byte { return m.b[:m.n] }

func (m *answerReq) append(b []byte) []byte {
	b = appendAddr(b, m.dest)
	t := byte(0)
	if m.timedOut {
		t = 1
	}
	b = append(b, t)
	return append(b, m.bytes()...)
}

func parseAnswer(b []byte) (answerReq, error) {
	var m answerReq
	if len(b) < addrSize+1 || len(b) > addrSize+1+maxAnswer {
		return m, badFrame("answer of %d bytes", len(b))
	}
	var err error
	if m.dest, err = parseAddr(b); err != nil {
		return m, err
	}
	switch b[addrSize] {
	case 0:
	case 1:
		m.timedOut = true
	default:
		return m, badFrame("answer flag %d", b[addrSize])
	}
	m.n = uint16(copy(m.b[:], b[addrSize+1:]))
	return m, nil
}

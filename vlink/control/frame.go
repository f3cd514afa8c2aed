package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Wire format of the control channel, after the VLink hello that
// authenticated the node (and the noise layer that encrypts the channel):
//
//	frame  = header | body
//	header = version u8 | op u8 | type u16 | length u32
//
// Integers are big-endian. The message ops (send, forward, deliver) carry
// a fixed body: the cooperation token, two length-prefixed node names
// and the payload:
//
//	message = coop u64 | len u8 | name | len u8 | name2 | payload
//
// For send the names are the destination and nothing; for forward the
// destination and the origin; for deliver the sender (the origin of a
// forwarded message) and the forwarder.
const (
	protoVersion = 1
	headerSize   = 8
	// MaxPayload bounds a message's payload. The control channel carries
	// requests and answers, not bulk data: a relayed connection is a
	// connection of its own.
	MaxPayload = 64 << 10
	// maxBody bounds every frame's body, and so what a peer can make the
	// other side allocate for one frame: a message, or one wrapped for
	// another relay (via, from: a name and a whole frame).
	maxBody   = maxInner + 1 + maxNameSize + headerSize
	maxInner  = MaxPayload + msgFixed + 2*maxNameSize
	msgFixed  = 8 + 1 + 1
	maxReason = 512
	maxAddrs  = 8
	pingSize  = 8
)

// maxNameSize is the longest node name: a DNS label.
const maxNameSize = 63

type op uint8

const (
	opPing      op = 1  // either side: keepalive; 8 opaque bytes echoed by the pong
	opPong      op = 2  // either side: the ping's bytes
	opSend      op = 3  // node: deliver this message to a node
	opForward   op = 4  // node: deliver a message received from origin to a node, on origin's behalf
	opDeliver   op = 5  // relay: a message from a node
	opError     op = 6  // relay: a message could not be delivered (its coop, the code, a reason)
	opLookup    op = 7  // node: where is this node (coop)
	opPeer      op = 8  // relay: the answer to a lookup
	opAdvertise op = 9  // node: the addresses it accepts connections on; its first frame registers it
	opWelcome   op = 10 // relay: registered; the address the node was seen from
	opDial      op = 11 // node: connect me to a node's port (coop, token, key, flags, reverse addresses)
	opOffer     op = 12 // relay: a node asks for a connection to a port (token, key, flags, where to connect back)
	opDecline   op = 13 // node: refuses an offer (token, code, reason)
	opReady     op = 14 // relay: the node took the offer; attach with the token (coop, token, key)
	opAttach    op = 15 // node, first frame of a data connection: the token it belongs to
	opAttached  op = 16 // relay: both ends are here; raw bytes from now on
	opPunch     op = 17 // node dialed -> relay -> dialer: where the node awaits a spliced connection (token, address)
	opSync      op = 18 // dialer -> relay -> node dialed: connect now (token)

	// Between relays of one network (links.go).
	opLink   op = 19 // either relay, first frame: the ports it takes connections on
	opJoined op = 20 // a node registered here, or changed its addresses (name, observed and advertised addresses)
	opLeft   op = 21 // a node registered here is gone (name)
	opVia    op = 22 // pass this frame, from a relay to a node, on to the node registered with you (name, frame)
	opFrom   op = 23 // a node registered here sent this frame about a connection you set up (name, frame)
)

// Flags of a dial, passed on in its offer.
const (
	// flagNoRelay: the dialer forbids the relay to carry the connection;
	// only the node's connection back to it will do.
	flagNoRelay uint8 = 1 << iota
	// flagSplice: the dialer offers a spliced connection (TCP
	// simultaneous open) from the port its dial names; the offer carries
	// that port at the dialer's observed address.
	flagSplice
	flagsKnown = flagNoRelay | flagSplice
)

// Sizes of a rendezvous' secrets.
const (
	tokenSize = 16
	keySize   = 32
)

func (o op) String() string {
	names := [...]string{"", "ping", "pong", "send", "forward", "deliver", "error", "lookup", "peer", "advertise", "welcome",
		"dial", "offer", "decline", "ready", "attach", "attached", "punch", "sync",
		"link", "joined", "left", "via", "from"}
	if int(o) < len(names) && o != 0 {
		return names[o]
	}
	return fmt.Sprintf("op %d", uint8(o))
}

// ErrMalformed is matched by errors about a frame that breaks the wire
// format. The channel that carried it is closed.
var ErrMalformed = errors.New("control: malformed frame")

// header is a frame header.
type header [headerSize]byte

func (h header) version() uint8 { return h[0] }
func (h header) op() op         { return op(h[1]) }
func (h header) typ() Type      { return Type(binary.BigEndian.Uint16(h[2:])) }
func (h header) len() int       { return int(binary.BigEndian.Uint32(h[4:])) }

// frame is a decoded control frame. Which fields mean something depends
// on op: the wire carries only those.
type frame struct {
	op      op
	typ     Type             // message ops
	coop    uint64           // message ops, error, lookup, peer
	name    string           // send/forward: destination; deliver: sender; error, lookup, peer: the node
	name2   string           // forward: origin; deliver: forwarder
	payload []byte           // message ops; ping and pong
	code    Code             // error
	reason  string           // error
	online  bool             // peer
	addrs   []netip.AddrPort // peer, advertise, welcome; dial, offer: where to connect back
	splice  netip.AddrPort   // dial, offer (flagSplice), punch: where a spliced connection goes; a node sends only the port
	port    uint16           // dial, offer
	flags   uint8            // dial, offer
	token   [tokenSize]byte  // dial, offer, decline, ready, attach
	key     []byte           // dial, offer, ready: the connection's end-to-end key
}

// append appends f's encoding to b.
func (f *frame) append(b []byte) []byte {
	start := len(b)
	b = append(b, protoVersion, byte(f.op), 0, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint16(b[start+2:], uint16(f.typ))
	switch f.op {
	case opSend, opForward, opDeliver:
		b = binary.BigEndian.AppendUint64(b, f.coop)
		b = appendName(b, f.name)
		b = appendName(b, f.name2)
		b = append(b, f.payload...)
	case opPing, opPong:
		b = append(b, f.payload...)
	case opError:
		b = binary.BigEndian.AppendUint64(b, f.coop)
		b = append(b, byte(f.code))
		b = appendName(b, f.name)
		b = append(b, f.reason...)
	case opLookup:
		b = binary.BigEndian.AppendUint64(b, f.coop)
		b = appendName(b, f.name)
	case opPeer:
		b = binary.BigEndian.AppendUint64(b, f.coop)
		b = appendName(b, f.name)
		online := byte(0)
		if f.online {
			online = 1
		}
		b = append(b, online)
		b = appendAddrs(b, f.addrs)
	case opAdvertise, opWelcome:
		b = appendAddrs(b, f.addrs)
	case opDial, opOffer:
		if f.op == opDial {
			b = binary.BigEndian.AppendUint64(b, f.coop)
		}
		b = append(b, f.token[:]...)
		b = append(b, f.key...)
		b = binary.BigEndian.AppendUint16(b, f.port)
		b = append(b, f.flags)
		b = appendName(b, f.name)
		b = appendAddrs(b, f.addrs)
		if f.flags&flagSplice != 0 {
			b = appendAddr(b, f.splice)
		}
	case opPunch:
		b = append(b, f.token[:]...)
		b = appendAddr(b, f.splice)
	case opSync:
		b = append(b, f.token[:]...)
	case opDecline:
		b = append(b, f.token[:]...)
		b = append(b, byte(f.code))
		b = append(b, f.reason...)
	case opReady:
		b = binary.BigEndian.AppendUint64(b, f.coop)
		b = append(b, f.token[:]...)
		b = append(b, f.key...)
	case opAttach:
		b = append(b, f.token[:]...)
	case opLink:
		b = appendAddrs(b, f.addrs)
	case opJoined, opLeft:
		b = appendName(b, f.name)
		b = appendAddrs(b, f.addrs)
	case opVia, opFrom:
		b = appendName(b, f.name)
		b = append(b, f.payload...)
	}
	binary.BigEndian.PutUint32(b[start+4:], uint32(len(b)-start-headerSize))
	return b
}

func appendName(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func appendAddrs(b []byte, addrs []netip.AddrPort) []byte {
	b = append(b, byte(len(addrs)))
	for _, a := range addrs {
		b = appendAddr(b, a)
	}
	return b
}

func appendAddr(b []byte, a netip.AddrPort) []byte {
	v, _ := a.MarshalBinary()
	b = append(b, byte(len(v)))
	return append(b, v...)
}

// readFrame reads exactly one frame from r.
func readFrame(r io.Reader) (*frame, error) {
	var h header
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	if h.version() != protoVersion {
		return nil, fmt.Errorf("%w: version %d, this side speaks %d", ErrMalformed, h.version(), protoVersion)
	}
	if h.len() > maxBody {
		return nil, fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrMalformed, h.op(), h.len(), maxBody)
	}
	body := make([]byte, h.len())
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decode(h, body)
}

// decode parses a frame's body.
func decode(h header, body []byte) (*frame, error) {
	f := &frame{op: h.op(), typ: h.typ()}
	d := decoder{b: body}
	if f.typ != 0 && f.op != opSend && f.op != opForward && f.op != opDeliver {
		return nil, fmt.Errorf("%w: %s carries a message type", ErrMalformed, f.op)
	}
	switch f.op {
	case opSend, opForward, opDeliver:
		if f.typ == 0 {
			return nil, fmt.Errorf("%w: %s without a message type", ErrMalformed, f.op)
		}
		f.coop = d.u64()
		f.name = d.name()
		f.name2 = d.name()
		f.payload = d.rest()
		if len(f.payload) > MaxPayload {
			return nil, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrMalformed, len(f.payload), MaxPayload)
		}
		if len(body) > maxInner {
			return nil, fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrMalformed, f.op, len(body), maxInner)
		}
		if d.err == nil && f.name == "" {
			d.err = errors.New("no destination or sender")
		}
		if d.err == nil && f.op == opSend && f.name2 != "" {
			d.err = errors.New("send with a second name")
		}
		if d.err == nil && f.op == opForward && f.name2 == "" {
			d.err = errors.New("forward without its origin")
		}
	case opPing, opPong:
		if f.payload = d.rest(); len(f.payload) != pingSize {
			d.err = fmt.Errorf("%s of %d bytes, want %d", f.op, len(f.payload), pingSize)
		}
	case opError:
		f.coop = d.u64()
		f.code = Code(d.byte())
		f.name = d.name()
		f.reason = d.text(maxReason)
		if d.err == nil && (f.code == 0 || f.code >= codeLimit) {
			d.err = fmt.Errorf("unknown error code %d", f.code)
		}
	case opLookup:
		f.coop = d.u64()
		if f.name = d.name(); d.err == nil && f.name == "" {
			d.err = errors.New("lookup of no name")
		}
	case opPeer:
		f.coop = d.u64()
		f.name = d.name()
		switch d.byte() {
		case 0:
		case 1:
			f.online = true
		default:
			d.err = errors.New("online flag is not 0 or 1")
		}
		f.addrs = d.addrs()
	case opAdvertise, opWelcome:
		f.addrs = d.addrs()
	case opDial, opOffer:
		if f.op == opDial {
			f.coop = d.u64()
		}
		d.token(&f.token)
		f.key = d.take(keySize)
		f.port = d.u16()
		if f.flags = d.byte(); d.err == nil && f.flags&^flagsKnown != 0 {
			d.err = fmt.Errorf("unknown flags %#x", f.flags)
		}
		if f.name = d.name(); d.err == nil && (f.name == "" || f.port == 0) {
			d.err = fmt.Errorf("%s without a node or a port", f.op)
		}
		f.addrs = d.addrs()
		if f.flags&flagSplice != 0 {
			f.splice = d.addr()
		}
	case opPunch:
		d.token(&f.token)
		f.splice = d.addr()
	case opSync:
		d.token(&f.token)
	case opDecline:
		d.token(&f.token)
		f.code = Code(d.byte())
		f.reason = d.text(maxReason)
		if d.err == nil && (f.code == 0 || f.code >= codeLimit) {
			d.err = fmt.Errorf("unknown error code %d", f.code)
		}
	case opReady:
		f.coop = d.u64()
		d.token(&f.token)
		f.key = d.take(keySize)
	case opAttach:
		d.token(&f.token)
	case opAttached:
	case opLink:
		f.addrs = d.addrs()
	case opJoined, opLeft:
		if f.name = d.name(); d.err == nil && f.name == "" {
			d.err = errors.New("no node named")
		}
		f.addrs = d.addrs()
	case opVia, opFrom:
		if f.name = d.name(); d.err == nil && f.name == "" {
			d.err = errors.New("no node named")
		}
		f.payload = d.rest()
	default:
		return nil, fmt.Errorf("%w: unknown op %d", ErrMalformed, uint8(f.op))
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the fields", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, f.op, d.err)
	}
	return f, nil
}

// unwrap decodes the frame a via or from frame carries, which must be
// whole, of one of the ops a relay passes on that way, and no larger
// than a frame a node may send or receive.
func (f *frame) unwrap() (*frame, error) {
	b := f.payload
	if len(b) < headerSize {
		return nil, fmt.Errorf("%w: %s carries %d bytes, no frame", ErrMalformed, f.op, len(b))
	}
	h := header(b[:headerSize])
	switch {
	case h.version() != protoVersion:
		return nil, fmt.Errorf("%w: %s carries a frame of version %d", ErrMalformed, f.op, h.version())
	case h.len() != len(b)-headerSize || h.len() > maxInner:
		return nil, fmt.Errorf("%w: %s carries a frame of %d bytes that says %d", ErrMalformed, f.op, len(b)-headerSize, h.len())
	}
	in, err := decode(h, b[headerSize:])
	if err != nil {
		return nil, err
	}
	var ok bool
	switch f.op {
	case opVia: // what a relay sends a node
		ok = in.op == opDeliver || in.op == opError || in.op == opOffer || in.op == opReady || in.op == opPunch || in.op == opSync
	case opFrom: // what a node tells its relay about another's connection
		ok = in.op == opPunch || in.op == opDecline
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s carries %s", ErrMalformed, f.op, in.op)
	}
	return in, nil
}

// decoder takes fields off a body; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = fmt.Errorf("truncated: want %d bytes, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) token(t *[tokenSize]byte) {
	copy(t[:], d.take(tokenSize))
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// name reads a length-prefixed node name; empty is allowed here, the
// callers decide where it is not.
func (d *decoder) name() string {
	v := d.take(int(d.byte()))
	if d.err == nil && len(v) > 0 && !ValidName(string(v)) {
		d.err = fmt.Errorf("invalid node name %q", v)
	}
	return string(v)
}

func (d *decoder) text(max int) string {
	v := d.rest()
	if len(v) > max {
		d.err = fmt.Errorf("text of %d bytes exceeds %d", len(v), max)
	}
	for _, c := range v {
		if c < ' ' || c == 0x7f {
			d.err = errors.New("text holds a control character")
			break
		}
	}
	return string(v)
}

func (d *decoder) rest() []byte {
	if d.err != nil {
		return nil
	}
	v := d.b
	d.b = nil
	return v
}

func (d *decoder) addrs() []netip.AddrPort {
	n := int(d.byte())
	if n > maxAddrs {
		d.err = fmt.Errorf("%d addresses, at most %d", n, maxAddrs)
		return nil
	}
	var out []netip.AddrPort
	for i := 0; i < n && d.err == nil; i++ {
		out = append(out, d.addr())
	}
	return out
}

// addr reads one length-prefixed address: an IP and a port, not 0.
func (d *decoder) addr() netip.AddrPort {
	v := d.take(int(d.byte()))
	var a netip.AddrPort
	if d.err == nil {
		if err := a.UnmarshalBinary(v); err != nil || !a.IsValid() || a.Port() == 0 {
			d.err = errors.New("an address that is not an IP and a port")
		}
	}
	return a
}

package vlink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// Wire format of the handshake. A VLink connection opens with the magic
// followed by a hello frame; every later handshake message is one frame:
//
//	frame = version u8 | type u8 | length u16 | body
//	body  = *( tag u8 | length u16 | value )
//
// Integers are big-endian. The magic starts with a byte above 0x7f and holds
// CR LF, SUB and LF, like PNG's, so no text protocol opens with it and a
// channel that mangles bytes is caught. A plain client's first bytes differ
// from it at once, so sniffing costs a plain connection no waiting unless
// it sends nothing at all.
const (
	magic        = "\x89VLK\r\n\x1a\n"
	protoVersion = 1
	headerSize   = 4
	fieldHeader  = 3
	// maxBody bounds every handshake frame, and so what a peer can make us
	// read before it is authenticated.
	maxBody = 4096

	nonceSize = 32
	proofSize = 32 // HMAC-SHA256
	// identitySize is the size of a listener's static key (Policy.Identity),
	// private or public: X25519.
	identitySize  = 32
	maxStackText  = 1024
	maxTargetText = 262 // a 255-byte host name, ':' and a port, or a bracketed IPv6 address
	maxReasonText = 1024
	maxNodeText   = maxNodeName // a DNS label

	// MaxHops bounds the nodes a connection may cross through route
	// layers (fwd): the hops a hello names and the trail of those it
	// has crossed, together. A forwarding loop so ends even where the
	// trail cannot tell (two spellings of one node).
	MaxHops      = 8
	maxHopsText  = MaxHops * (maxTargetText + 1)
	trailIDSize  = 8 // a forwarding listener's random identity
	maxOriginTxt = len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535")
)

type msgType uint8

const (
	msgHello     msgType = 1 // dialer: the stack to mirror, the target, a nonce if it holds a key, its node name
	msgChallenge msgType = 2 // listener: its nonce, when it requires a key
	msgAuth      msgType = 3 // dialer: proof that it holds the key
	msgAccept    msgType = 4 // listener: go ahead (with its own proof if authenticated)
	msgRefuse    msgType = 5 // listener: a code and a reason
)

func (t msgType) String() string {
	switch t {
	case msgHello:
		return "hello"
	case msgChallenge:
		return "challenge"
	case msgAuth:
		return "auth"
	case msgAccept:
		return "accept"
	case msgRefuse:
		return "refuse"
	}
	return fmt.Sprintf("message type %d", uint8(t))
}

type fieldTag uint8

const (
	tagStack  fieldTag = 1 // text form of the mirrored layers
	tagTarget fieldTag = 2 // host:port the listener should forward to
	tagNonce  fieldTag = 3
	tagProof  fieldTag = 4
	tagCode   fieldTag = 5  // RefuseCode, one byte
	tagReason fieldTag = 6  // UTF-8 text for a person
	tagNode   fieldTag = 7  // the dialer's node name (ValidNodeName)
	tagHops   fieldTag = 8  // the nodes to forward through, host:port, comma-separated
	tagOrigin fieldTag = 9  // where the connection came from, IP:port, as its first node saw it
	tagTrail  fieldTag = 10 // the forwarding listeners crossed so far, trailIDSize bytes each
	tagHop    fieldTag = 11 // in a refusal: how many nodes beyond the sender refused, u8
	tagStatic fieldTag = 12 // in an accept: the listener's static X25519 public key (Policy.Identity)
	tagLookup fieldTag = 13 // in a hello: only say whether the target's host resolves (one byte, 1)
	tagFamily fieldTag = 14 // in the accept of a lookup: the host's address families (Families, one byte)
	tagCert   fieldTag = 15 // in a hello or its accept: the sender's certificate (Member, nodecert's encoding)
	// in the hello that names the target: a datagram session to it (one
	// byte): 1, the connection then carries netconn/dgram's frames; 2,
	// and the datagrams that fit ride QUIC DATAGRAM frames beside the
	// stream at the bottom (Hello.QUICDatagrams)
	tagDatagram fieldTag = 16
	// in a hello: the congestion control algorithm the dialer's TCP
	// connection under it uses, for the listener's side to use too
	// (Hello.CongestionControl; netconn.ValidCongestionControl)
	tagCC fieldTag = 17
	// in a hello: the ciphers the dialer offers its encryption layer,
	// one byte each (layer.AEAD), fastest first; in its accept: the one
	// the listener chose, one byte (layer.AEADNegotiator)
	tagAEAD fieldTag = 18
	// in a hello that names a target: how long the dialer waits for the
	// listener to reach it, in milliseconds, u32 (Hello.TargetWait);
	// sent only beyond DefaultHandshakeTimeout, which every listener
	// gives, so that an older listener takes the usual hello
	tagWait fieldTag = 19
	// in a keyed hello: the encryption layer's first message follows it
	// at once, and the dialer expects no challenge (firstField)
	tagFirst fieldTag = 20

	lastTag = tagFirst // the newest field this side knows
)

// A hello's first field: what the listener needs to take the encryption
// layer's first message with the hello (layer.FirstFlight), all of it in
// the body the hello's mark covers:
//
//	time u64 | cipher u8 | length u32 | [static 32]
//
// time is the dialer's clock (Unix milliseconds), for the listener's
// replay window; cipher the layer.AEAD the dialer runs, which the
// listener must choose from the hello's offer too; length the bytes of
// the layer's first message after the hello; static, if present, the
// listener's static key as the dialer pinned it.
const (
	firstFieldSize = 8 + 1 + 4
	// maxFirstMessage bounds what follows a hello with a first field:
	// one record of the encryption layer, its header and Noise's
	// largest message.
	maxFirstMessage = 3 + 65535
)

type firstField struct {
	time   uint64
	aead   layer.AEAD
	length uint32
	static []byte
}

func (f *firstField) encode() []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, firstFieldSize+identitySize), f.time)
	b = append(b, byte(f.aead))
	b = binary.BigEndian.AppendUint32(b, f.length)
	return append(b, f.static...)
}

func decodeFirst(v []byte) (*firstField, error) {
	if len(v) != firstFieldSize && len(v) != firstFieldSize+identitySize {
		return nil, fmt.Errorf("first is %d bytes, want %d or %d", len(v), firstFieldSize, firstFieldSize+identitySize)
	}
	f := &firstField{time: binary.BigEndian.Uint64(v), aead: layer.AEAD(v[8]), length: binary.BigEndian.Uint32(v[9:])}
	switch f.aead {
	case layer.AEADDefault, layer.AEADChaChaPoly, layer.AEADAESGCM:
	default:
		return nil, fmt.Errorf("first names cipher %d, which is not known", v[8])
	}
	if f.length == 0 || f.length > maxFirstMessage {
		return nil, fmt.Errorf("first announces %d bytes, want 1..%d", f.length, maxFirstMessage)
	}
	if len(v) > firstFieldSize {
		f.static = bytes.Clone(v[firstFieldSize:])
	}
	return f, nil
}

// maxAEADOffer bounds an offer: room for ciphers not yet known, which a
// listener ignores.
const maxAEADOffer = 8

// The values of tagDatagram.
const (
	datagramStream byte = 1 // every datagram framed on the stream
	datagramQUIC   byte = 2 // those that fit in QUIC DATAGRAM frames
)

// allowed lists the fields each message may carry.
var allowed = map[msgType][]fieldTag{
	msgHello:     {tagStack, tagTarget, tagNonce, tagNode, tagHops, tagOrigin, tagTrail, tagLookup, tagCert, tagDatagram, tagCC, tagAEAD, tagWait, tagFirst},
	msgChallenge: {tagNonce},
	msgAuth:      {tagProof},
	msgAccept:    {tagProof, tagStatic, tagFamily, tagCert, tagAEAD},
	msgRefuse:    {tagCode, tagReason, tagHop},
}

// header is a frame header.
type header [headerSize]byte

func (h header) Version() uint8 { return h[0] }
func (h header) Type() msgType  { return msgType(h[1]) }
func (h header) Len() int       { return int(binary.BigEndian.Uint16(h[2:])) }

// message is a decoded handshake frame.
type message struct {
	typ    msgType
	stack  string
	target string
	node   string
	nonce  []byte
	proof  []byte
	code   RefuseCode
	reason string
	hops   []string    // next hops, in order
	origin string      // an IP:port
	trail  []byte      // trailIDSize bytes per listener crossed
	hop    uint8       // in a refusal, see RefusedError.Hop
	static []byte      // in an accept: the listener's static public key
	lookup bool        // in a hello: a lookup (Dialer.LookupHost)
	dgram  bool        // in a hello: a datagram session (Hello.Datagram)
	qdgram bool        // and its datagrams ride QUIC's (Hello.QUICDatagrams)
	family Families    // in the accept of a lookup
	cert   []byte      // the sender's certificate, undecoded (Member checks it)
	cc     string      // in a hello: the congestion control to use (Hello.CongestionControl)
	aeads  []byte      // in a hello: the ciphers offered (layer.AEAD); in an accept: the one chosen
	wait   uint32      // in a hello: how long the dialer waits for its target, ms (Hello.TargetWait)
	first  *firstField // in a hello: the encryption layer's first message follows
}

// ErrBadHello is matched by errors about a malformed handshake: wrong magic
// or version, oversized or truncated frames, unknown or repeated fields.
var ErrBadHello = errors.New("malformed handshake")

// appendFrame appends m's frame to b.
func (m *message) appendFrame(b []byte) []byte {
	start := len(b)
	b = append(b, protoVersion, byte(m.typ), 0, 0)
	field := func(t fieldTag, v []byte) {
		if v != nil {
			b = append(b, byte(t), 0, 0)
			binary.BigEndian.PutUint16(b[len(b)-2:], uint16(len(v)))
			b = append(b, v...)
		}
	}
	str := func(t fieldTag, s string) {
		if s != "" {
			field(t, []byte(s))
		}
	}
	str(tagStack, m.stack)
	str(tagTarget, m.target)
	str(tagNode, m.node)
	str(tagHops, strings.Join(m.hops, ","))
	str(tagOrigin, m.origin)
	if len(m.trail) > 0 {
		field(tagTrail, m.trail)
	}
	field(tagNonce, m.nonce)
	field(tagProof, m.proof)
	field(tagStatic, m.static)
	field(tagCert, m.cert)
	if m.code != 0 {
		field(tagCode, []byte{byte(m.code)})
	}
	str(tagReason, m.reason)
	if m.hop != 0 {
		field(tagHop, []byte{m.hop})
	}
	if m.lookup {
		field(tagLookup, []byte{1})
	}
	switch {
	case m.qdgram:
		field(tagDatagram, []byte{datagramQUIC})
	case m.dgram:
		field(tagDatagram, []byte{datagramStream})
	}
	if m.family != 0 {
		field(tagFamily, []byte{byte(m.family)})
	}
	str(tagCC, m.cc)
	if len(m.aeads) > 0 {
		field(tagAEAD, m.aeads)
	}
	if m.wait != 0 {
		field(tagWait, binary.BigEndian.AppendUint32(nil, m.wait))
	}
	if m.first != nil {
		field(tagFirst, m.first.encode())
	}
	binary.BigEndian.PutUint16(b[start+2:], uint16(len(b)-start-headerSize))
	return b
}

// decodeBody parses a frame body of type t.
func decodeBody(t msgType, body []byte) (*message, error) {
	ok, known := allowed[t]
	if !known {
		return nil, fmt.Errorf("%w: unknown message type %d", ErrBadHello, uint8(t))
	}
	m := &message{typ: t}
	var seen uint64
	for len(body) > 0 {
		if len(body) < fieldHeader {
			return nil, fmt.Errorf("%w: %s: truncated field header", ErrBadHello, t)
		}
		tag, n := fieldTag(body[0]), int(binary.BigEndian.Uint16(body[1:3]))
		body = body[fieldHeader:]
		if n > len(body) {
			return nil, fmt.Errorf("%w: %s: field %d claims %d bytes, %d left", ErrBadHello, t, tag, n, len(body))
		}
		v := body[:n]
		body = body[n:]
		if !tagIn(tag, ok) {
			if tag > lastTag {
				return nil, fmt.Errorf("%w: %s: unexpected field %d, newer than this side (upgrade it: listeners first)", ErrBadHello, t, tag)
			}
			return nil, fmt.Errorf("%w: %s: unexpected field %d", ErrBadHello, t, tag)
		}
		if seen&(1<<tag) != 0 {
			return nil, fmt.Errorf("%w: %s: field %d repeated", ErrBadHello, t, tag)
		}
		seen |= 1 << tag
		var err error
		switch tag {
		case tagStack:
			m.stack, err = text(v, maxStackText, "stack")
		case tagTarget:
			m.target, err = text(v, maxTargetText, "target")
		case tagReason:
			m.reason, err = text(v, maxReasonText, "reason")
		case tagNode:
			if m.node, err = text(v, maxNodeText, "node"); err == nil && !ValidNodeName(m.node) {
				err = fmt.Errorf("node %q: %w", m.node, ErrBadNodeName)
			}
		case tagHops:
			m.hops, err = decodeHops(v)
		case tagOrigin:
			if m.origin, err = text(v, maxOriginTxt, "origin"); err == nil {
				if _, perr := netip.ParseAddrPort(m.origin); perr != nil {
					err = fmt.Errorf("origin %q is not an IP:port", m.origin)
				}
			}
		case tagTrail:
			if len(v) == 0 || len(v)%trailIDSize != 0 || len(v) > MaxHops*trailIDSize {
				err = fmt.Errorf("trail is %d bytes, want a multiple of %d up to %d", len(v), trailIDSize, MaxHops*trailIDSize)
			}
			m.trail = append([]byte(nil), v...)
		case tagHop:
			if len(v) != 1 || v[0] == 0 || v[0] > MaxHops {
				err = fmt.Errorf("hop must be one byte in 1..%d", MaxHops)
			}
			if len(v) == 1 {
				m.hop = v[0]
			}
		case tagNonce:
			m.nonce, err = fixed(v, nonceSize, "nonce")
		case tagProof:
			m.proof, err = fixed(v, proofSize, "proof")
		case tagStatic:
			m.static, err = fixed(v, identitySize, "static key")
		case tagCert:
			// Parsed and checked by the Member that reads it; here
			// only bounded, so no frame holds more than a certificate.
			if len(v) == 0 || len(v) > nodecert.MaxSize {
				err = fmt.Errorf("certificate is %d bytes, want 1..%d", len(v), nodecert.MaxSize)
			}
			m.cert = append([]byte(nil), v...)
		case tagLookup:
			if len(v) != 1 || v[0] != 1 {
				err = errors.New("lookup must be the byte 1")
			}
			m.lookup = true
		case tagCC:
			if m.cc = string(v); !netconn.ValidCongestionControl(m.cc) {
				err = errors.New("congestion control must be 1 to 15 letters, digits, _ or -")
			}
		case tagAEAD:
			m.aeads, err = decodeAEADs(t, v)
		case tagWait:
			if len(v) != 4 || binary.BigEndian.Uint32(v) == 0 {
				err = errors.New("wait must be a non-zero u32 of milliseconds")
			}
			if len(v) == 4 {
				m.wait = binary.BigEndian.Uint32(v)
			}
		case tagFirst:
			m.first, err = decodeFirst(v)
		case tagDatagram:
			if len(v) != 1 || v[0] != datagramStream && v[0] != datagramQUIC {
				err = errors.New("datagram must be the byte 1 or 2")
			}
			m.dgram, m.qdgram = true, len(v) == 1 && v[0] == datagramQUIC
		case tagFamily:
			if len(v) != 1 || v[0] == 0 || Families(v[0])&^(FamilyIPv4|FamilyIPv6) != 0 {
				err = errors.New("families must be one byte of known, non-zero bits")
			}
			if len(v) == 1 {
				m.family = Families(v[0])
			}
		case tagCode:
			if len(v) != 1 || v[0] == 0 {
				err = errors.New("refusal code must be one non-zero byte")
			}
			if len(v) == 1 {
				m.code = RefuseCode(v[0])
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrBadHello, t, err)
		}
	}
	return m, nil
}

// decodeAEADs checks a cipher offer (a hello's: 1..maxAEADOffer distinct
// non-zero values, unknown ones allowed) or choice (an accept's: one
// known value).
func decodeAEADs(t msgType, v []byte) ([]byte, error) {
	if t == msgAccept {
		if len(v) != 1 || (layer.AEAD(v[0]) != layer.AEADChaChaPoly && layer.AEAD(v[0]) != layer.AEADAESGCM) {
			return nil, errors.New("the chosen cipher must be one known byte")
		}
		return []byte{v[0]}, nil
	}
	if len(v) == 0 || len(v) > maxAEADOffer {
		return nil, fmt.Errorf("a cipher offer holds 1..%d bytes, not %d", maxAEADOffer, len(v))
	}
	for i, a := range v {
		if a == 0 || bytes.IndexByte(v[:i], a) >= 0 {
			return nil, errors.New("a cipher offer holds distinct non-zero bytes")
		}
	}
	return bytes.Clone(v), nil
}

// decodeHops parses the hops field: 1..MaxHops distinct host:port, the
// port numeric, comma-separated.
func decodeHops(v []byte) ([]string, error) {
	s, err := text(v, maxHopsText, "hops")
	if err != nil {
		return nil, err
	}
	hops := strings.Split(s, ",")
	if len(hops) > MaxHops {
		return nil, fmt.Errorf("%d hops, at most %d", len(hops), MaxHops)
	}
	for i, h := range hops {
		if err := checkTarget(h); err != nil {
			return nil, fmt.Errorf("hop %q: %v", h, err)
		}
		for _, prev := range hops[:i] {
			if prev == h {
				return nil, fmt.Errorf("%w: hop %s named twice", ErrLoop, h)
			}
		}
	}
	return hops, nil
}

func tagIn(t fieldTag, set []fieldTag) bool {
	for _, s := range set {
		if s == t {
			return true
		}
	}
	return false
}

func text(v []byte, max int, what string) (string, error) {
	if len(v) == 0 || len(v) > max {
		return "", fmt.Errorf("%s is %d bytes, want 1..%d", what, len(v), max)
	}
	if !utf8.Valid(v) {
		return "", fmt.Errorf("%s is not UTF-8", what)
	}
	for _, c := range v {
		if c < ' ' && what != "reason" {
			return "", fmt.Errorf("%s holds a control character", what)
		}
	}
	return string(v), nil
}

func fixed(v []byte, n int, what string) ([]byte, error) {
	if len(v) != n {
		return nil, fmt.Errorf("%s is %d bytes, want %d", what, len(v), n)
	}
	return append([]byte(nil), v...), nil
}

// readFrame reads exactly one frame, never more, so whatever follows the
// handshake stays in the connection for the layers above. want lists the
// types acceptable at this point. It returns the raw body too, for proofs.
func readFrame(r io.Reader, want ...msgType) (*message, []byte, error) {
	var h header
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, nil, err
	}
	if h.Version() != protoVersion {
		return nil, nil, &versionError{got: h.Version()}
	}
	if !tagTypeIn(h.Type(), want) {
		return nil, nil, fmt.Errorf("%w: got %s, want %v", ErrBadHello, h.Type(), want)
	}
	if h.Len() > maxBody {
		return nil, nil, fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrBadHello, h.Type(), h.Len(), maxBody)
	}
	body := make([]byte, h.Len())
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, err
	}
	m, err := decodeBody(h.Type(), body)
	return m, body, err
}

func tagTypeIn(t msgType, set []msgType) bool {
	for _, s := range set {
		if s == t {
			return true
		}
	}
	return false
}

type versionError struct{ got uint8 }

func (e *versionError) Error() string {
	return fmt.Sprintf("%v: protocol version %d, this side speaks %d", ErrBadHello, e.got, protoVersion)
}
func (e *versionError) Unwrap() error { return ErrBadHello }

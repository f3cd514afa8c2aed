package preload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// Wire format between the shim (C, in the program) and the agent (Go), over
// a unix stream socket. One request, then its reply, at a time per channel;
// the shim opens as many channels as it has threads asking at once.
//
//	frame = version u8 | type u8 | length u16 | body
//
// Integers are big-endian and every body has a fixed layout per type (the
// C side reads fields at fixed offsets), except the trailing name of
// msgResolve and msgNameOf. The C decoder in shim/vlink_preload.c checks
// the same limits as this one: a frame is at most headerSize+maxBody bytes.
const (
	protoVersion = 2
	headerSize   = 4
	maxBody      = 512
	maxName      = 253 // a DNS name without its trailing dot

	addrSize     = 19 // family u8 | port u16 | ip [16]
	tokenSize    = 16
	helloSize    = 4 + tokenSize
	welcomeSize  = 38
	connectSize  = addrSize + 6
	resultSize   = 12
	attachSize   = 8 + addrSize
	nameSize     = 21
	peerSize     = addrSize
	peerAddrSz   = 1 + addrSize
	whySize      = 8
	errnoSize    = 2
	listenSize   = 2 * addrSize
	acceptSize   = addrSize
	acceptInfoSz = 1 + 2*addrSize
	datagramSize = 2*addrSize + 1
	maxServed    = 64 // ports in a msgServed
)

type msgType uint8

// Message types. Requests come from the shim, replies from the agent.
const (
	msgHello      msgType = 1  // shim: pid u32 | token [16] (EnvAgentToken)
	msgWelcome    msgType = 2  // agent: what the shim needs to know once (welcome)
	msgConnect    msgType = 3  // shim: a connect to decide, and dial unless direct
	msgResult     msgType = 4  // agent: direct, error, relay, or a descriptor (SCM_RIGHTS)
	msgAttach     msgType = 5  // shim: the relay connection from this address is for this token (no reply)
	msgResolve    msgType = 6  // shim: a name to resolve, and the port if known
	msgName       msgType = 7  // agent: resolve locally, a fake address pair, or no such name
	msgPeer       msgType = 8  // shim: whom did the relay connection from this address ask for?
	msgPeerAddr   msgType = 9  // agent: the address the program connected to
	msgAddrName   msgType = 10 // shim: the name behind a fake address (getnameinfo)
	msgNameOf     msgType = 11 // agent: found u8 | name
	msgIPTable    msgType = 12 // agent, after the welcome if flagged: the rules for IP destinations (iptable.go)
	msgWhy        msgType = 13 // shim: how did the dial for this token fail? (a held connect that was reset)
	msgErrno      msgType = 14 // agent: errno u16, 0 if the token failed for no reason it knows
	msgServed     msgType = 15 // agent, after the welcome if flagged: count u8 | the ports it serves, u16 each
	msgListen     msgType = 16 // shim: a served socket listens: the address the program bound | where it really listens (agent: msgErrno)
	msgAccepted   msgType = 17 // shim: whose is the connection accepted from this address (the agent's end)?
	msgAcceptInfo msgType = 18 // agent: kind u8 | remote | local; a plain client's descriptor comes with it (SCM_RIGHTS)
	msgDatagram   msgType = 19 // shim: a UDP socket's connect: destination | relay family u8 | the socket's address seen from loopback (agent: msgResult)
	msgRecipe     msgType = 20 // agent, after a msgResult flagged resultFlagRecipe: how to make that connect without asking (recipe.go)
	msgAnswer     msgType = 21 // shim: what a recipe's gateway answered instead of its accept (recipe.go; agent: msgErrno)
)

func (t msgType) String() string {
	names := [...]string{"", "hello", "welcome", "connect", "result", "attach", "resolve", "name", "peer", "peer-addr", "addr-name", "name-of", "ip-table", "why", "errno", "served", "listen", "accepted", "accept-info", "datagram", "recipe", "answer"}
	if int(t) < len(names) && t != 0 {
		return names[t]
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// ErrBadFrame is matched by every decoding error: the channel is closed.
var ErrBadFrame = errors.New("preload: bad frame")

func badFrame(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadFrame, fmt.Sprintf(format, args...))
}

// header is a frame's typed header.
type header [headerSize]byte

func (h *header) version() uint8 { return h[0] }
func (h *header) typ() msgType   { return msgType(h[1]) }
func (h *header) length() int    { return int(binary.BigEndian.Uint16(h[2:])) }

// readFrame reads one frame into buf and returns its type and body, a
// slice of buf. It reads exactly one frame and never more.
func readFrame(r io.Reader, buf *[headerSize + maxBody]byte) (msgType, []byte, error) {
	if _, err := io.ReadFull(r, buf[:headerSize]); err != nil {
		return 0, nil, err
	}
	h := (*header)(buf[:headerSize])
	if h.version() != protoVersion {
		return 0, nil, badFrame("version %d, want %d", h.version(), protoVersion)
	}
	n := h.length()
	if n > maxBody {
		return 0, nil, badFrame("%v body of %d bytes, over %d", h.typ(), n, maxBody)
	}
	body := buf[headerSize : headerSize+n]
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return h.typ(), body, nil
}

// appendFrame appends a frame of type t with the given body.
func appendFrame(b []byte, t msgType, body []byte) []byte {
	b = append(b, protoVersion, byte(t))
	b = binary.BigEndian.AppendUint16(b, uint16(len(body)))
	return append(b, body...)
}

// sockAddr is an IP address and port as the shim sends them: the family
// of the address, not of the program's socket (IPv4-mapped IPv6 addresses
// arrive as IPv4).
type sockAddr = netip.AddrPort

func appendAddr(b []byte, a sockAddr) []byte {
	ip := a.Addr()
	var raw [16]byte
	fam := byte(6)
	if ip.Is4() {
		fam = 4
		v4 := ip.As4()
		copy(raw[:], v4[:])
	} else {
		raw = ip.As16()
	}
	b = append(b, fam)
	b = binary.BigEndian.AppendUint16(b, a.Port())
	return append(b, raw[:]...)
}

func parseAddr(b []byte) (sockAddr, error) {
	if len(b) < addrSize {
		return sockAddr{}, badFrame("address of %d bytes, want %d", len(b), addrSize)
	}
	port := binary.BigEndian.Uint16(b[1:3])
	var ip netip.Addr
	switch b[0] {
	case 4:
		for _, c := range b[7:addrSize] {
			if c != 0 {
				return sockAddr{}, badFrame("IPv4 address with trailing bytes")
			}
		}
		ip = netip.AddrFrom4([4]byte(b[3:7]))
	case 6:
		ip = netip.AddrFrom16([16]byte(b[3:addrSize]))
		if ip.Is4In6() {
			return sockAddr{}, badFrame("IPv4-mapped address sent as IPv6")
		}
	default:
		return sockAddr{}, badFrame("address family %d", b[0])
	}
	return netip.AddrPortFrom(ip, port), nil
}

// Connect modes: how the program's socket waits. modeFlagOwn, or'd in:
// the socket may make the connect itself with a route's options (a
// direct recipe, recipe.go): it is unbound and the shim knows every
// option the program set on it.
const (
	modeAsync   = 1 // non-blocking socket: reply at once, dial in the background
	modeSync    = 2 // blocking socket: dial, then reply
	modeFlagOwn = 0x80
)

// connectReq asks for a connect's route and, unless it is direct, a
// connection.
type connectReq struct {
	dest      sockAddr
	family    uint8  // the program socket's family: 4 or 6
	mode      uint8  // modeAsync or modeSync
	own       bool   // modeFlagOwn
	timeoutMs uint32 // the socket's SO_SNDTIMEO for a blocking connect; 0 none
}

func (m *connectReq) append(b []byte) []byte {
	b = appendAddr(b, m.dest)
	mode := m.mode
	if m.own {
		mode |= modeFlagOwn
	}
	b = append(b, m.family, mode)
	return binary.BigEndian.AppendUint32(b, m.timeoutMs)
}

func parseConnect(b []byte) (connectReq, error) {
	var m connectReq
	if len(b) != connectSize {
		return m, badFrame("connect of %d bytes, want %d", len(b), connectSize)
	}
	var err error
	if m.dest, err = parseAddr(b); err != nil {
		return m, err
	}
	m.family, m.mode, m.own = b[addrSize], b[addrSize+1]&^modeFlagOwn, b[addrSize+1]&modeFlagOwn != 0
	if m.family != 4 && m.family != 6 {
		return m, badFrame("socket family %d", m.family)
	}
	if m.mode != modeAsync && m.mode != modeSync {
		return m, badFrame("connect mode %d", m.mode)
	}
	m.timeoutMs = binary.BigEndian.Uint32(b[addrSize+2:])
	return m, nil
}

// Result kinds.
const (
	resultDirect = 1 // connect by yourself
	resultError  = 2 // fail with errno
	resultRelay  = 3 // connect to the relay listener (blocking) or the held listener (non-blocking) and attach with token
	resultFD     = 4 // the descriptor that comes with this frame replaces yours
	// resultDatagram answers msgDatagram: connect the UDP socket to the
	// agent's datagram relay on loopback (of the family asked for), whose
	// port is the token (datagram_linux.go).
	resultDatagram = 5
)

// Result flags. resultFlagCache: the verdict holds for this address and
// port for the agent's lifetime, so the shim may remember it.
// resultFlagRecipe: a msgRecipe follows, for the shim to make the next
// blocking connects to this address and port by itself; with
// resultDirect, a direct recipe, for this connect too.
const (
	resultFlagCache  = 1
	resultFlagRecipe = 2
)

type result struct {
	kind  uint8
	flags uint8
	errno uint16
	token uint64
}

func (m *result) append(b []byte) []byte {
	b = append(b, m.kind, m.flags)
	b = binary.BigEndian.AppendUint16(b, m.errno)
	return binary.BigEndian.AppendUint64(b, m.token)
}

type attachReq struct {
	token uint64
	local sockAddr // the local address of the program's relay connection
}

func (m *attachReq) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, m.token)
	return appendAddr(b, m.local)
}

func parseAttach(b []byte) (attachReq, error) {
	if len(b) != attachSize {
		return attachReq{}, badFrame("attach of %d bytes, want %d", len(b), attachSize)
	}
	local, err := parseAddr(b[8:])
	return attachReq{token: binary.BigEndian.Uint64(b), local: local}, err
}

// datagramReq asks for a UDP socket's route and, unless it is direct, a
// datagram relay.
type datagramReq struct {
	dest   sockAddr
	family uint8    // the relay's loopback family: 4 (127.0.0.1) or 6 ([::1])
	local  sockAddr // the program's socket as the relay will see it: the only source it takes
}

func (m *datagramReq) append(b []byte) []byte {
	b = appendAddr(b, m.dest)
	b = append(b, m.family)
	return appendAddr(b, m.local)
}

func parseDatagram(b []byte) (datagramReq, error) {
	var m datagramReq
	if len(b) != datagramSize {
		return m, badFrame("datagram of %d bytes, want %d", len(b), datagramSize)
	}
	var err error
	if m.dest, err = parseAddr(b); err != nil {
		return m, err
	}
	if m.family = b[addrSize]; m.family != 4 && m.family != 6 {
		return m, badFrame("relay family %d", m.family)
	}
	if m.local, err = parseAddr(b[addrSize+1:]); err != nil {
		return m, err
	}
	if m.local.Addr().Is4() != (m.family == 4) {
		return m, badFrame("local address %v for a relay of family %d", m.local, m.family)
	}
	return m, nil
}

type resolveReq struct {
	port uint16 // 0: not known (no service, or a service name)
	name string
}

func (m *resolveReq) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, m.port)
	return append(b, m.name...)
}

// parseResolve checks only the frame; whether the name is a valid host
// name is the agent's to decide (it answers nameNone).
func parseResolve(b []byte) (resolveReq, error) {
	if len(b) < 3 || len(b) > 2+maxName+1 {
		return resolveReq{}, badFrame("resolve of %d bytes, want 3 to %d", len(b), 2+maxName+1)
	}
	return resolveReq{port: binary.BigEndian.Uint16(b), name: string(b[2:])}, nil
}

// Name kinds.
const (
	nameLocal = 1 // resolve it with the system's resolver, as without the shim
	nameFake  = 2 // the far side resolves it: use these addresses
	nameNone  = 3 // no such name
)

type nameReply struct {
	kind uint8
	v4   [4]byte
	v6   [16]byte
}

func (m *nameReply) append(b []byte) []byte {
	b = append(b, m.kind)
	b = append(b, m.v4[:]...)
	return append(b, m.v6[:]...)
}

func parsePeer(b []byte) (sockAddr, error) {
	if len(b) != peerSize {
		return sockAddr{}, badFrame("peer of %d bytes, want %d", len(b), peerSize)
	}
	return parseAddr(b)
}

// welcome is what the agent tells every new channel.
type welcome struct {
	flags     uint32 // welcomeIPsDirect
	relay4    uint16 // port of the relay listener on 127.0.0.1
	relay6    uint16 // port of the relay listener on [::1]; 0 if none
	timeoutMs uint32 // the agent's dial timeout
	fake4     netip.Prefix
	fake6     netip.Prefix
	held4     uint16 // port of the held listener on 127.0.0.1 (held_linux.go)
	held6     uint16 // port of the held listener on [::1]; 0 if none
}

// Welcome flags.
const (
	// welcomeIPsDirect: every IP address destination outside the fake
	// ranges goes direct, so the shim need not ask about them.
	welcomeIPsDirect = 1
	// welcomeIPTable: a msgIPTable frame follows the welcome.
	welcomeIPTable = 2
	// welcomeServed: a msgServed frame follows the welcome (and the IP
	// table): the ports on which the program's listeners take VLink
	// clients (served_linux.go).
	welcomeServed = 4
)

// Accept kinds (msgAcceptInfo).
const (
	acceptUnknown = 0 // the agent did not make this connection: drop it
	acceptPlain   = 1 // a plain client: its own socket comes with the frame
	acceptRelayed = 2 // a VLink client, relayed over this connection
)

type listenReq struct {
	bound   sockAddr // what the program bound (its port is served)
	private sockAddr // the loopback address its socket listens on instead
}

type acceptInfo struct {
	kind          uint8
	remote, local sockAddr // the client's address, and the one it connected to
}

func (m *acceptInfo) append(b []byte) []byte {
	b = append(b, m.kind)
	b = appendAddr(b, m.remote)
	return appendAddr(b, m.local)
}

// appendServed encodes the served ports (at most maxServed).
func appendServed(b []byte, ports []uint16) []byte {
	b = append(b, byte(len(ports)))
	for _, p := range ports {
		b = binary.BigEndian.AppendUint16(b, p)
	}
	return b
}

func (m *welcome) append(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, m.flags)
	b = binary.BigEndian.AppendUint16(b, m.relay4)
	b = binary.BigEndian.AppendUint16(b, m.relay6)
	b = binary.BigEndian.AppendUint32(b, m.timeoutMs)
	v4 := m.fake4.Addr().As4()
	b = append(b, v4[:]...)
	b = append(b, byte(m.fake4.Bits()))
	v6 := m.fake6.Addr().As16()
	b = append(b, v6[:]...)
	b = append(b, byte(m.fake6.Bits()))
	b = binary.BigEndian.AppendUint16(b, m.held4)
	return binary.BigEndian.AppendUint16(b, m.held6)
}

func parseHello(b []byte) (pid uint32, token [tokenSize]byte, err error) {
	if len(b) != helloSize {
		return 0, token, badFrame("hello of %d bytes, want %d", len(b), helloSize)
	}
	copy(token[:], b[4:])
	return binary.BigEndian.Uint32(b), token, nil
}

// request is one decoded request from the shim.
type request struct {
	typ     msgType
	pid     uint32 // msgHello
	token   [tokenSize]byte
	connect connectReq
	attach  attachReq
	resolve resolveReq
	addr    sockAddr // msgPeer (the program's local address), msgAddrName, msgAccepted (the agent's end)
	why     uint64   // msgWhy: a relay token
	listen  listenReq
	dgram   datagramReq
	answer  answerReq
}

// parseRequest decodes a request body of type t.
func parseRequest(t msgType, body []byte) (request, error) {
	r := request{typ: t}
	var err error
	switch t {
	case msgHello:
		r.pid, r.token, err = parseHello(body)
	case msgConnect:
		r.connect, err = parseConnect(body)
	case msgAttach:
		r.attach, err = parseAttach(body)
	case msgResolve:
		r.resolve, err = parseResolve(body)
	case msgPeer:
		r.addr, err = parsePeer(body)
	case msgAddrName:
		if len(body) != addrSize {
			return r, badFrame("addr-name of %d bytes, want %d", len(body), addrSize)
		}
		r.addr, err = parseAddr(body)
	case msgWhy:
		if len(body) != whySize {
			return r, badFrame("why of %d bytes, want %d", len(body), whySize)
		}
		r.why = binary.BigEndian.Uint64(body)
	case msgListen:
		if len(body) != listenSize {
			return r, badFrame("listen of %d bytes, want %d", len(body), listenSize)
		}
		if r.listen.bound, err = parseAddr(body); err == nil {
			r.listen.private, err = parseAddr(body[addrSize:])
		}
	case msgDatagram:
		r.dgram, err = parseDatagram(body)
	case msgAnswer:
		r.answer, err = parseAnswer(body)
	case msgAccepted:
		if len(body) != acceptSize {
			return r, badFrame("accepted of %d bytes, want %d", len(body), acceptSize)
		}
		r.addr, err = parseAddr(body)
	default:
		return r, badFrame("unexpected %v from the shim", t)
	}
	return r, err
}

// appendRequest encodes r, as the shim would: the inverse of parseRequest,
// for tests and the fuzz target's round trip.
func appendRequest(b []byte, r *request) []byte {
	var body []byte
	switch r.typ {
	case msgHello:
		body = binary.BigEndian.AppendUint32(nil, r.pid)
		body = append(body, r.token[:]...)
	case msgConnect:
		body = r.connect.append(nil)
	case msgAttach:
		body = r.attach.append(nil)
	case msgResolve:
		body = r.resolve.append(nil)
	case msgPeer, msgAddrName, msgAccepted:
		body = appendAddr(nil, r.addr)
	case msgListen:
		body = appendAddr(appendAddr(nil, r.listen.bound), r.listen.private)
	case msgWhy:
		body = binary.BigEndian.AppendUint64(nil, r.why)
	case msgDatagram:
		body = r.dgram.append(nil)
	case msgAnswer:
		body = r.answer.append(nil)
	}
	return appendFrame(b, r.typ, body)
}

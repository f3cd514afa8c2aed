package vlink

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Labels keep a dialer's proof from ever being valid as a listener's,
// and a lookup's answer from passing for a connection's accept.
const (
	labelClient = "vlink-v1 client proof\x00"
	labelServer = "vlink-v1 server proof\x00"
	labelLookup = "vlink-v1 lookup answer\x00"
)

// proof binds the key to this hello and this challenge, and to the
// channel below when the factory secured one (binding; see
// channelBinding).
func proof(key []byte, label string, helloBody, serverNonce, binding []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	m.Write(helloBody)
	m.Write(serverNonce)
	m.Write(binding)
	return m.Sum(nil)
}

// channelBinding returns the binding of c's channel, if c comes straight
// from a factory that secured it (layer.ChannelBinder): both proofs of
// the hello cover it, so a man in the middle of that channel fails
// them. Only the hello with the channel's other end is bound: hellos
// relayed through a node run over more than one channel.
func channelBinding(c net.Conn) []byte {
	if b, ok := c.(layer.ChannelBinder); ok {
		return b.ChannelBinding()
	}
	return nil
}

// clientHandshake sends hello on c and waits for the listener's answer.
// A hello that names a node proves that node's key (NodeKey). It returns
// the transcript: every handshake byte sent and received, in order (see
// layer.Handshake), and the accept (with the static key it announced, if
// any). binding is the channel's, for a hello with the channel's other
// end (see channelBinding). The caller sets c's deadline.
func clientHandshake(c net.Conn, hello *message, key, binding []byte) (transcript []byte, acc *message, err error) {
	buf := helloBytes(hello, key)
	if _, err := c.Write(buf); err != nil {
		return nil, nil, fmt.Errorf("sending hello: %w", err)
	}
	transcript, acc, _, err = clientAnswer(c, hello, buf, key, binding)
	return transcript, acc, err
}

// clientAnswer reads the listener's answer to hello, sent on c as buf,
// and goes on to the accept: see clientHandshake. fast reports an accept
// that took a first flight (hello.first) without a challenge: the
// transcript is then the hello alone.
func clientAnswer(c net.Conn, hello *message, buf, key, binding []byte) (transcript []byte, acc *message, fast bool, err error) {
	helloBody := buf[len(magic)+headerSize:]
	transcript = buf
	m, body, err := readFrame(c, msgChallenge, msgAccept, msgRefuse)
	if err != nil {
		return nil, nil, false, answerError(err)
	}
	if m.typ == msgAccept && key != nil && hello.first != nil {
		// The mark proved the key and the listener took the hello as
		// fresh; its proof covers no nonce of its own.
		if !hmac.Equal(m.proof, proof(key, labelServer, helloBody, nil, binding)) {
			return nil, nil, false, fmt.Errorf("%w: the listener could not prove it holds the key", ErrAuth)
		}
		return transcript, m, true, nil
	}
	transcript, acc, err = clientLongWay(c, hello, m, body, transcript, key, binding)
	return transcript, acc, false, err
}

// clientLongWay goes on from the listener's first answer m (with its
// body) to a hello: the challenge and the proof if it asked for them,
// then the accept.
func clientLongWay(c net.Conn, hello *message, m *message, body, transcript, key, binding []byte) ([]byte, *message, error) {
	helloBody := transcript[len(magic)+headerSize:]
	var err error
	if m.typ == msgChallenge {
		if key == nil && hello.cert != nil {
			return nil, nil, &RefusedError{Code: CodeAuthRequired, Reason: "the listener requires a pre-shared key and checks no certificate: it is not a member of this network"}
		}
		if key == nil {
			return nil, nil, &RefusedError{Code: CodeAuthRequired, Reason: "the listener requires a pre-shared key; give one (--key-file, key_file in the config)"}
		}
		if m.nonce == nil {
			return nil, nil, fmt.Errorf("%w: challenge without a nonce", ErrBadHello)
		}
		transcript = appendFrameBytes(transcript, m.typ, body)
		auth := (&message{typ: msgAuth, proof: proof(key, labelClient, helloBody, m.nonce, binding)}).appendFrame(nil)
		if _, err := c.Write(auth); err != nil {
			return nil, nil, fmt.Errorf("sending proof: %w", err)
		}
		transcript = append(transcript, auth...)
		serverNonce := m.nonce
		if m, body, err = readFrame(c, msgAccept, msgRefuse); err != nil {
			return nil, nil, answerError(err)
		}
		want := proof(key, labelServer, helloBody, serverNonce, binding)
		if hello.lookup {
			want = lookupProof(key, helloBody, serverNonce, m.family, binding)
		}
		if m.typ == msgAccept && !hmac.Equal(m.proof, want) {
			return nil, nil, fmt.Errorf("%w: the listener could not prove it holds the key", ErrAuth)
		}
	} else if m.typ == msgAccept && key != nil {
		return nil, nil, fmt.Errorf("%w: the listener accepted without checking the key, so it cannot prove who it is; refusing", ErrAuth)
	}
	if m.typ == msgRefuse {
		return nil, nil, &RefusedError{Code: m.code, Reason: m.reason, Hop: int(m.hop)}
	}
	if hello.lookup && m.family == 0 {
		return nil, nil, fmt.Errorf("%w: the accept of a lookup names no address family", ErrBadHello)
	}
	if m.aeads != nil && !bytes.Contains(hello.aeads, m.aeads) {
		return nil, nil, fmt.Errorf("%w: the listener chose cipher %d, which the hello did not offer", ErrBadHello, m.aeads[0])
	}
	return appendFrameBytes(transcript, m.typ, body), m, nil
}

// helloBytes is the magic and the hello frame, with a fresh nonce if the
// dialer holds a key, marked with the key (firstflight.go).
func helloBytes(hello *message, key []byte) []byte {
	hello.typ = msgHello
	hello.nonce = nil
	if key != nil {
		hello.nonce = make([]byte, nonceSize)
		rand.Read(hello.nonce[:nonceSize-markSize])
	}
	buf := append(make([]byte, 0, len(magic)+headerSize+96+len(hello.stack)+len(hello.target)+len(hello.node)), magic...)
	buf = hello.appendFrame(buf)
	if key != nil {
		sealMark(key, buf[len(magic)+headerSize:])
	}
	return buf
}

// answerError explains a failure to read the listener's answer.
func answerError(err error) error {
	var ve *versionError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return fmt.Errorf("%w: it closed the connection without answering the hello (%w)", ErrNotVLink, err)
	case errors.As(err, &ve), errors.Is(err, ErrBadHello):
		return fmt.Errorf("%w: it answered the hello with something else (%v)", ErrNotVLink, err)
	}
	return fmt.Errorf("waiting for the answer to the hello: %w", err)
}

// serverHandshake runs the listener's side after the magic has been read:
// it reads the hello, authenticates and checks it against the policy. On
// refusal it sends the refusal and returns it.
//
// A nested hello (j non-nil) arrives on a connection a multi-link layer
// built out of connections whose hellos were checked: it inherits their
// authentication, node name and key, and needs no challenge of its own.
//
// A hello that names a node proves that node's key, NodeKey(Policy.Key,
// node), instead of Policy.Key, and the listener proves it back with the
// same key: the name is bound to the proof, never taken on trust.
//
// An end-to-end hello (via non-nil) arrives through route layers, after
// the hello of the last node on the way (via): it comes from the origin
// that node vouched for (via.RemoteAddr), and proves its own key to this
// listener, as if it had dialed it.
func (l *Listener) serverHandshake(c net.Conn, j *junction, via *Hello) (_ *Hello, err error) {
	p := &l.cfg.Policy
	m, helloBody, err := readFrame(c, msgHello)
	if err == nil {
		defer func() { err = withStack(err, m.stack) }()
	}
	if err != nil {
		var ve *versionError
		switch {
		case errors.As(err, &ve):
			return nil, sendRefusal(c, refuse(CodeVersion, "this listener speaks protocol version %d; upgrade the older side", protoVersion))
		case errors.Is(err, ErrBadHello):
			return nil, sendRefusal(c, refuse(CodeMalformed, "%v", err))
		}
		return nil, fmt.Errorf("reading hello: %w", err)
	}
	h := &Hello{Target: m.target, Lookup: m.lookup, Datagram: m.dgram, QUICDatagrams: m.qdgram, RemoteAddr: c.RemoteAddr(), key: p.Key, listener: l,
		TargetWait: time.Duration(m.wait) * time.Millisecond}
	if m.aeads != nil {
		h.AEAD = layer.ChooseAEAD(aeadsOf(m.aeads))
	}
	if m.cc != "" && j == nil {
		// The dialer's sender uses it; this side's, for what goes back,
		// must too, or a download crawls where the upload flew.
		h.CongestionControl = m.cc
		if tc := netconn.TCPBelow(c); tc != nil {
			if err := netconn.SetCongestionControl(tc, m.cc); err != nil {
				return nil, sendRefusal(c, refuse(CodeParam, "%v", err))
			}
		}
	}
	marked := j == nil && via == nil && l.marked(c, m, helloBody)
	if marked {
		l.shed.markedRead(c) // a replayed hello could have a mark: the challenge decides
	}
	h.transcript = appendFrameBytes([]byte(magic), msgHello, helloBody)
	if m.first != nil {
		// Read what follows before any answer, so that a refusal never
		// meets unread bytes (which would make the close a reset).
		take := marked && l.takesFirst(c, m, helloBody)
		if err := l.readFirst(c, m, h, take); err != nil {
			return nil, fmt.Errorf("reading the first message after the hello: %w", err)
		}
		h.early, h.offersEarly = take && l.takesEarly(m), l.offersEarly()
	}
	// A connection from another node of a vlink network comes with the
	// key the relay gave both ends for it, and the dialer's name: the
	// hello proves that key, whatever the policy's. An end-to-end hello
	// comes from beyond the node that proved it.
	vouched, _ := c.(Vouched)
	if via != nil {
		vouched = nil
		h.RemoteAddr, h.Forwarded = via.RemoteAddr, via.Forwarded
	}
	if m.cert != nil {
		if rerr := l.certHello(m, h, j, via, vouched); rerr != nil {
			return nil, sendRefusal(c, rerr)
		}
	} else if p.Member != nil && vouched != nil && j == nil {
		return nil, sendRefusal(c, refuse(CodeAuthRequired, "this node takes connections from other nodes with their certificates only: the key the relay hands out would let the relay read them"))
	}
	if vouched != nil && j == nil && m.cert == nil {
		if m.node != "" {
			return nil, sendRefusal(c, refuse(CodeMalformed, "a hello from another node of the network names no node: the relay vouched for it"))
		}
		if m.nonce == nil {
			return nil, sendRefusal(c, refuse(CodeAuthRequired, "a connection from another node must prove the key the relay gave it"))
		}
		h.key = vouched.VouchedKey()
	}
	if j != nil {
		h.RemoteAddr, h.Forwarded = j.remote, j.forwarded
		h.Authenticated = j.authenticated
		h.Node, h.key, h.Cert = j.node, j.key, j.cert
		h.nested = true
		h.Session = j.session
		if m.node != "" {
			return nil, sendRefusal(c, refuse(CodeMalformed, "a nested hello names no node: its connection's hello did"))
		}
	}
	if m.node != "" && j == nil {
		if p.Key == nil {
			return nil, sendRefusal(c, refuse(CodeAuthRequired, "the hello names node %q, and a node name needs a listener key to check it; this listener has none and takes no name on trust", m.node))
		}
		if m.nonce == nil {
			return nil, sendRefusal(c, refuse(CodeAuthRequired, "the hello names node %q but proves no key: a node must prove its node key", m.node))
		}
		h.key = NodeKey(p.Key, m.node)
	}
	if p.Key != nil && j != nil && !j.authenticated {
		return nil, sendRefusal(c, refuse(CodeAuthRequired, "this listener requires a pre-shared key"))
	}
	if p.Key != nil && j != nil && m.nonce != nil {
		return nil, sendRefusal(c, refuse(CodeMalformed, "a nested hello carries no nonce: its connection is already authenticated"))
	}
	if h.key != nil && j == nil && h.first != nil {
		// A first flight taken: its mark proved the key, and it is
		// fresh (takesFirst).
		h.Authenticated = true
		h.Node = m.node
		h.serverProof = proof(h.key, labelServer, helloBody, nil, nil)
		h.helloBody = helloBody
	} else if h.key != nil && j == nil {
		if m.nonce == nil {
			return nil, sendRefusal(c, refuse(CodeAuthRequired, "this listener requires a pre-shared key"))
		}
		nonce := make([]byte, nonceSize)
		rand.Read(nonce)
		challenge := (&message{typ: msgChallenge, nonce: nonce}).appendFrame(nil)
		if _, err := c.Write(challenge); err != nil {
			return nil, fmt.Errorf("sending challenge: %w", err)
		}
		a, authBody, err := readFrame(c, msgAuth)
		if err != nil {
			if errors.Is(err, ErrBadHello) {
				return nil, sendRefusal(c, refuse(CodeMalformed, "%v", err))
			}
			return nil, fmt.Errorf("reading proof: %w", err)
		}
		// h.key is Policy.Key, or the named node's key derived from it.
		if j == nil && via == nil {
			h.binding = channelBinding(c) // the hello of the channel's other end
		}
		if !hmac.Equal(a.proof, proof(h.key, labelClient, helloBody, nonce, h.binding)) {
			if m.node != "" {
				return nil, sendRefusal(c, refuse(CodeAuthFailed, "the proof does not match the key of node %q on this listener's network", m.node))
			}
			return nil, sendRefusal(c, refuse(CodeAuthFailed, "the proof does not match this listener's key"))
		}
		h.Authenticated = true
		h.Node = m.node
		if vouched != nil {
			h.Node = vouched.VouchedPeer()
		}
		h.serverProof = proof(h.key, labelServer, helloBody, nonce, h.binding)
		h.helloBody, h.nonce = helloBody, nonce
		h.transcript = appendFrameBytes(append(h.transcript, challenge...), msgAuth, authBody)
	}
	if rerr := l.checkRoute(m, h, j != nil || via != nil); rerr != nil {
		return nil, sendRefusal(c, rerr)
	}
	stack, rerr := p.checkStack(m.stack, h.key != nil || h.Cert != nil)
	if rerr != nil {
		return nil, sendRefusal(c, rerr)
	}
	h.Stack = stack
	keyed := keyedLayer(stack.Layers) != ""
	switch {
	case h.Cert != nil && j != nil && keyed:
		return nil, sendRefusal(c, refuse(CodeLayer, "a member encrypts once, below the multi-link layer: the %s layer above it has no key to use", EncryptionLayer))
	case h.Cert != nil && j == nil && !keyed:
		return nil, sendRefusal(c, refuse(CodeLayer, "a certificate is proven by the %s layer, which this hello's stack lacks: put it below any multi-link layer (mux+%s)", EncryptionLayer, EncryptionLayer))
	case h.Cert != nil && h.Lookup:
		return nil, sendRefusal(c, refuse(CodeLayer, "a lookup's answer is proven by the pre-shared key, and a member holds none"))
	}
	if name := keyedLayer(stack.Layers); name != "" && h.key == nil && h.Cert == nil {
		return nil, sendRefusal(c, refuse(CodeLayer, "layer %s needs a pre-shared key and this listener has none (vlink serve --key-file, Policy.Key)", name))
	}
	// Bytes that cross a network are encrypted: the bottom segment's
	// hello (a nested one rides inside it) must hold the encryption
	// layer when it comes from beyond loopback.
	// A hello that goes on to other nodes carries the end-to-end hello
	// after it, which is checked where it ends.
	// A channel whose binding the proofs covered (QUIC's) is encrypted
	// and authenticated already.
	// Above a multi-link layer (noise+mux), the encryption layer comes
	// with each nested hello, and is required there.
	if j == nil {
		h.clear = h.key != nil && !p.InsecurePlaintext && !h.routed() && !isLoopback(h.RemoteAddr) && !keyed && h.binding == nil
		h.unproven = !keyed
	} else {
		h.clear, h.unproven = j.clear && !keyed, j.unproven && !keyed
	}
	if h.clear && !multiLinkOnTop(stack) {
		if j != nil {
			return nil, sendRefusal(c, refuse(CodeLayer, "this listener encrypts what comes from beyond loopback: the layers above the multi-link layer need %s (vlink adds it below them when the key is set), or let plaintext in (vlink serve --insecure-plaintext, Policy.InsecurePlaintext)", EncryptionLayer))
		}
		return nil, sendRefusal(c, refuse(CodeLayer, "this listener encrypts what comes from beyond loopback: add %s to the stack (vlink adds it when the key is set), or let plaintext in (vlink serve --insecure-plaintext, Policy.InsecurePlaintext)", EncryptionLayer))
	}
	// The first encryption layer on the connection's way up proves the
	// listener's identity: its own hello's, or a nested one's when the
	// segments below had none.
	h.static = l.static != nil && keyed && (j == nil || j.unproven) && h.Cert == nil
	switch {
	case h.Datagram && h.Lookup:
		return nil, sendRefusal(c, refuse(CodeMalformed, "a hello is a lookup or a datagram session, not both"))
	case h.Datagram && h.Target == "":
		return nil, sendRefusal(c, refuse(CodeMalformed, "a datagram session names its target"))
	case h.QUICDatagrams:
		// The dialer asks only on a quic stream straight to here: on
		// any other, its datagrams would go nowhere.
		if j == nil && via == nil && vouched == nil && len(m.hops) == 0 && len(m.trail) == 0 && m.origin == "" {
			h.carrier = layer.DatagramCarrierOf(c)
		}
		if h.carrier == nil {
			return nil, sendRefusal(c, refuse(CodeLayer, "QUIC datagrams asked for on a connection that does not carry them here"))
		}
	}
	if h.Target != "" {
		target := h.Target
		if h.Lookup {
			// A lookup may not know the port yet: 0 stands for any.
			if host, port, err := net.SplitHostPort(target); err == nil && port == "0" {
				target = net.JoinHostPort(host, "1")
			}
		}
		if err := checkTarget(target); err != nil {
			return nil, sendRefusal(c, refuse(CodeMalformed, "target %q: %v", h.Target, err))
		}
		targets := l.targets
		if h.Datagram {
			targets = l.datagrams
		}
		switch {
		case targets == nil && h.Datagram:
			return nil, sendRefusal(c, refuse(CodeTarget, "this listener relays no datagrams (Policy.Datagrams, vlink serve --allow-udp)"))
		case targets == nil:
			return nil, sendRefusal(c, refuse(CodeTarget, "this listener does not forward"))
		}
		if r, err := targets.Match(h.Target); err != nil || r.Action == selector.Refuse {
			if h.Datagram {
				return nil, sendRefusal(c, refuse(CodeTarget, "relaying datagrams to %s is not allowed here (Policy.Datagrams, vlink serve --allow-udp)", h.Target))
			}
			return nil, sendRefusal(c, refuse(CodeTarget, "forwarding to %s is not allowed here", h.Target))
		}
	}
	// The network's rules, at the member that accepts: on the hello
	// that names the target (a nested one, above a multi-link layer).
	if rules := p.memberRules(); h.Cert != nil && rules.Len() > 0 && (h.Target != "" || !multiLinkOnTop(stack)) {
		port := uint16(0)
		if _, ps, err := net.SplitHostPort(h.Target); err == nil {
			n, _ := strconv.ParseUint(ps, 10, 16)
			port = uint16(n)
		}
		if !rules.Allowed(h.Cert, p.Member.Cert, port) {
			return nil, sendRefusal(c, refuse(CodeTarget, "the network's rules do not let %s reach %s on port %d", h.Cert.Name(), p.Member.Cert.Name(), port))
		}
	}
	return h, nil
}

// certHello checks the certificate a hello carries against the
// listener's Member, and makes h the certificate's node's.
func (l *Listener) certHello(m *message, h *Hello, j *junction, via *Hello, vouched Vouched) *RefusedError {
	member := l.cfg.Policy.Member
	switch {
	case member == nil:
		return refuse(CodeAuthRequired, "this listener is no member of a network with an owner and checks no certificate (vlink serve --cert, Policy.Member)")
	case j != nil:
		return refuse(CodeMalformed, "a nested hello carries no certificate: its connection's hello did")
	case via != nil || len(m.hops) > 0 || len(m.trail) > 0 || m.origin != "":
		// Route layers carry no certificate yet: say so first.
		return refuse(CodeLayer, "certificates do not travel through route layers (fwd) yet")
	case m.node != "" || m.nonce != nil:
		return refuse(CodeMalformed, "a hello with a certificate names no node and proves no key: the certificate names the node, and the encryption layer proves it")
	}
	cert, err := member.peer(m.cert)
	if err != nil {
		return refuse(CodeAuthFailed, "certificate refused: %v", err)
	}
	if vouched != nil && cert.Name() != vouched.VouchedPeer() {
		return refuse(CodeAuthFailed, "the network says node %q dialed, and the certificate names %q", vouched.VouchedPeer(), cert.Name())
	}
	h.Cert, h.Node, h.Authenticated, h.key = cert, cert.Name(), true, nil
	return nil
}

// accept sends the accept for h, which ends h's transcript.
func accept(c net.Conn, h *Hello) error {
	m := &message{typ: msgAccept, proof: h.serverProof}
	if h.static {
		m.static = h.listener.static
	}
	if h.Cert != nil && !h.nested {
		m.cert = h.listener.cfg.Policy.Member.Cert.Marshal()
	}
	if h.AEAD != layer.AEADDefault {
		m.aeads = []byte{byte(h.AEAD)}
	}
	b := m.appendFrame(nil)
	if h.first == nil {
		// A first flight's layer is bound to the hello alone: its
		// first message came before this answer.
		h.transcript = append(h.transcript, b...)
	}
	_, err := c.Write(b)
	return err
}

// appendFrameBytes appends the frame readFrame returned as (t, body) as
// it was on the wire: readFrame checked its header, so the header is
// rebuilt exactly.
func appendFrameBytes(b []byte, t msgType, body []byte) []byte {
	b = append(b, protoVersion, byte(t), byte(len(body)>>8), byte(len(body)))
	return append(b, body...)
}

// aeadOffer returns what a hello for seg offers: the ciphers of seg's
// first filter that negotiates its cipher (layer.AEADNegotiator), nil if
// none does.
func aeadOffer(seg []Layer) []byte {
	for _, l := range seg {
		if spec := lookup(l.Name); spec != nil && spec.Kind == layer.KindFilter {
			if _, v, err := l.build(); err == nil {
				if n, ok := v.(layer.AEADNegotiator); ok {
					var b []byte
					for _, a := range n.AEADs() {
						b = append(b, byte(a))
					}
					return b
				}
			}
		}
	}
	return nil
}

// aeadsOf converts an offer's bytes.
func aeadsOf(b []byte) []layer.AEAD {
	a := make([]layer.AEAD, len(b))
	for i, v := range b {
		a[i] = layer.AEAD(v)
	}
	return a
}

// keyedLayer returns the name of the first layer that needs the
// pre-shared key (a layer.HandshakeFilter), or "".
// multiLinkOnTop reports whether a hello's stack ends with a multi-link
// layer, so that nested hellos follow with the layers above it.
func multiLinkOnTop(s Stack) bool {
	if len(s.Layers) == 0 {
		return false
	}
	spec := lookup(s.Layers[0].Name)
	return spec != nil && spec.Kind == layer.KindMultiLink
}

func keyedLayer(layers []Layer) string {
	for _, l := range layers {
		if spec := lookup(l.Name); spec != nil && spec.Kind == layer.KindFilter {
			if _, v, err := l.build(); err == nil {
				if _, ok := v.(layer.HandshakeFilter); ok {
					return l.Name
				}
			}
		}
	}
	return ""
}

// serverFilter applies a filter of h's segment on the listener's side,
// handing a layer.HandshakeFilter h's key (the node's key when the dialer
// named one, as the dialer hands its side) and h's transcript.
func (l *Listener) serverFilter(f layer.Filter, c net.Conn, h *Hello) (net.Conn, error) {
	if hf, ok := f.(layer.HandshakeFilter); ok {
		hs := layer.Handshake{Key: h.key, Transcript: h.transcript, AEAD: h.AEAD, First: h.first, Early: h.early, OffersEarly: h.offersEarly}
		h.first, h.early, h.offersEarly = nil, false, false // for this layer only, the bottom one
		if h.static {
			hs.Static = layer.KeyPair{Private: l.cfg.Policy.Identity, Public: l.static}
		}
		if h.Cert != nil {
			hs.Static, hs.PeerStatic = l.cfg.Policy.Member.keyPair(), h.Cert.PublicKey()
		}
		return hf.ServerHandshake(c, hs)
	}
	return f.Server(c)
}

// sendRefusal tells the dialer why and returns the refusal as the error.
func sendRefusal(c net.Conn, r *RefusedError) error {
	if len(r.Reason) > maxReasonText {
		r.Reason = strings.ToValidUTF8(r.Reason[:maxReasonText], "")
	}
	hop := uint8(0)
	if r.Hop > 0 && r.Hop <= MaxHops {
		hop = uint8(r.Hop) // how many nodes beyond this one refused
	}
	c.Write((&message{typ: msgRefuse, code: r.Code, reason: r.Reason, hop: hop}).appendFrame(nil))
	return r
}

// isTimeout reports whether err is a deadline expiry.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// checkTarget accepts host:port with a numeric port only: the target comes
// from the network, and a service name would make the listener consult
// its services database on a stranger's behalf.
func checkTarget(target string) error {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number in 1..65535", port)
	}
	return nil
}

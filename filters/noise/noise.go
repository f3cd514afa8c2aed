// Package noise provides the "noise" filter: it encrypts and
// authenticates a stream with the Noise protocol
// Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s (github.com/flynn/noise), keyed by
// vlink's pre-shared key (vlink.Dialer.Key, vlink.Policy.Key, --key-file).
// Each connection runs a fresh ephemeral X25519 exchange, so recording the
// traffic and stealing the key later does not decrypt it (forward
// secrecy), and only a peer holding the key completes the handshake
// (mutual authentication). The handshake's prologue is a hash of the
// VLink hello's transcript, so the authenticated hello and the encrypted
// channel cannot be split: a hello changed on the way fails the handshake.
// A listener with an identity (vlink.Policy.Identity), whose accept
// announced its static key, runs NKpsk0 instead, which also proves it
// holds that key's private half, so dialers can pin it
// (vlink.Dialer.PeerKey). Between members of a network with an owner
// (vlink.Member), whose hello and accept carry certificates binding each
// side's static key, it runs KK with no pre-shared key: each side proves
// it holds its certificate's key, and nothing shared opens the channel.
//
// After the handshake the stream is a sequence of records (frame.go) of
// at most [MaxPlain] application bytes, each sealed under the next
// nonce; an end record marks a clean end. A record that does not
// authenticate fails the connection with an error matching [ErrAuth], and
// a stream that ends without its end record is io.ErrUnexpectedEOF, both
// inside a *net.OpError naming "noise". The connections honour the whole
// net.Conn contract. Threat model and construction: docs/ARCHITECTURE.md
// §12.
package noise

import (
	"crypto/hkdf"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"slices"

	flynn "github.com/flynn/noise"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name:    "noise",
		Kind:    layer.KindFilter,
		Summary: "encrypt and authenticate (Noise NNpsk0 with the pre-shared key, NKpsk0 for a listener with an identity, KK between members' certificates; X25519, AES-256-GCM where both ends have AES instructions, else ChaCha20-Poly1305)",
		Params: []layer.Param{
			{Name: "aes", Type: layer.TypeBool, Default: "true", Local: true,
				Doc: "offer AES-256-GCM where this CPU has AES instructions (the listener takes it if it has them too); false offers ChaCha20-Poly1305 only"},
		},
		EndMarker: true,
		New:       func(a layer.Args) (any, error) { return Filter{NoAES: !a.Bool("aes")}, nil },
	})
}

// MinKeySize is the shortest pre-shared key accepted, as vlink's.
const MinKeySize = 16

// Labels separate what is derived from the key and the transcript here
// from any other use of them.
const (
	pskLabel      = "vlink noise v1 psk"
	prologueLabel = "vlink noise v1 prologue\x00"
)

// The cipher suites, by the cipher the hello agreed on.
var (
	suite    = flynn.NewCipherSuite(flynn.DH25519, flynn.CipherChaChaPoly, flynn.HashBLAKE2s)
	suiteAES = flynn.NewCipherSuite(flynn.DH25519, flynn.CipherAESGCM, flynn.HashSHA256)
)

func suiteFor(a layer.AEAD) (flynn.CipherSuite, error) {
	switch a {
	case layer.AEADDefault, layer.AEADChaChaPoly:
		return suite, nil
	case layer.AEADAESGCM:
		return suiteAES, nil
	}
	return nil, fmt.Errorf("%w: the hello agreed on cipher %v, which this layer does not have", ErrAuth, a)
}

// Filter is the noise layer. It implements layer.HandshakeFilter: it
// needs the pre-shared key and the hello's transcript, which vlink hands
// it through ClientHandshake and ServerHandshake. It is a
// layer.AEADNegotiator: its hello offers the ciphers, and its records use
// the one the handshake it is handed names:
//
//   - ChaCha20-Poly1305 with BLAKE2s (Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s
//     and its NK and KK kin) when the hello offered nothing, as hellos
//     from before the offer, or when either end lacks AES instructions;
//   - AES-256-GCM with SHA-256 (Noise_NNpsk0_25519_AESGCM_SHA256) when
//     both ends have them: it seals at about twice ChaCha20-Poly1305's
//     speed there.
//
// The offer is a field of the hello that listeners from before it refuse
// as malformed: upgrade listeners first. A hello from a dialer without
// AES instructions carries none.
type Filter struct {
	// NoAES offers ChaCha20-Poly1305 only (the parameter aes=false).
	NoAES bool
}

var (
	_ layer.AEADNegotiator = Filter{}
	_ layer.FirstFlighter  = Filter{}
)

// AEADs returns the ciphers the hello offers: this machine's
// (layer.LocalAEADs) if AES-256-GCM is among them and f.NoAES is not
// set, else none: ChaCha20-Poly1305 alone, the layer's first cipher,
// needs no offer, and a hello without one is what listeners from before
// the offer read.
func (f Filter) AEADs() []layer.AEAD {
	local := layer.LocalAEADs()
	if f.NoAES || !slices.Contains(local, layer.AEADAESGCM) {
		return nil
	}
	return local
}

// Client fails: the layer needs the key and the hello's transcript,
// which only ClientHandshake gets.
func (Filter) Client(net.Conn) (net.Conn, error) { return nil, errNoHandshake }

// Server fails as Client does.
func (Filter) Server(net.Conn) (net.Conn, error) { return nil, errNoHandshake }

var errNoHandshake = fmt.Errorf("noise: %w and the hello's transcript (use it in a vlink stack)", layer.ErrKeyRequired)

// ClientHandshake runs the initiator's side of the handshake on c and
// returns the encrypted connection, which owns c. The caller bounds it
// with c's deadline.
func (Filter) ClientHandshake(c net.Conn, hs layer.Handshake) (net.Conn, error) {
	return handshake(c, hs, true)
}

// FirstFlight reports that the layer sends its first message with the
// hello (layer.FirstFlighter): a keyed connection then costs one round
// trip, hello included, instead of three.
func (Filter) FirstFlight() bool { return true }

// ServerHandshake runs the responder's side of the handshake on c.
func (Filter) ServerHandshake(c net.Conn, hs layer.Handshake) (net.Conn, error) {
	return handshake(c, hs, false)
}

// Handshake messages (NNpsk0):
//
//	-> psk, e        the initiator's ephemeral key, sealed with the PSK
//	<- e, ee         the responder's, and the ephemeral-ephemeral DH
//
// When the listener has a static key (vlink.Policy.Identity), which its
// accept announced and the dialer checked, both use NKpsk0 instead:
//
//	<- s             known beforehand: the accept's key
//	...
//	-> psk, e, es    also a DH of the initiator's ephemeral and that key
//	<- e, ee
//
// Between members of a network with an owner (vlink.Member), whose
// certificates in the hello and its accept gave each side the other's
// static key, both use KK, with no pre-shared key:
//
//	-> s, <- s       known beforehand: the certificates' keys
//	...
//	-> e, es, ss     reading it proves the initiator holds its key
//	<- e, ee, se     reading it proves the responder holds its own
//
// Each message's payload is sealed with everything mixed in so far
// (prologue, PSK, DH), so reading it proves the sender holds the key and
// saw the same hello; with NKpsk0, reading the responder's also proves it
// holds the static key's private half. The payloads are empty but for
// early data (early.go): the initiator's first message may carry the
// connection's first bytes, and the responder's answer says in a byte of
// flags what it did with them.
func handshake(c net.Conn, hs layer.Handshake, initiator bool) (net.Conn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "handshake", Net: "noise", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	if initiator {
		var send, recv *cipherState
		var err error
		switch {
		case hs.FirstFlight != nil && hs.Early:
			return newEarlyConn(c, hs), nil // the handshake waits for the first bytes
		case hs.FirstFlight != nil:
			send, recv, _, err = firstFlight(c, hs, nil, opErr)
		default:
			send, recv, _, err = initiate(c, hs, opErr)
		}
		if err != nil {
			return nil, err
		}
		return newConn(c, send, recv), nil
	}
	st, mutual, err := newState(hs, false, nil)
	if err != nil {
		return nil, opErr(err)
	}
	var buf [headerSize + maxHandshake]byte
	var msg []byte
	if hs.First != nil {
		// It came with the hello, which vlink read.
		msg, err = firstRecord(hs.First)
	} else {
		msg, err = readHandshake(c, &buf, mutual)
	}
	if err != nil {
		return nil, opErr(err)
	}
	payload, _, _, err := st.ReadMessage(nil, msg)
	if err != nil {
		return nil, opErr(fmt.Errorf("%w: %s (%v)", ErrAuth, failure(mutual), err))
	}
	var flags byte
	switch {
	case len(payload) == 0:
	case hs.First == nil:
		// Only a first flight carries data: a dialer that goes the
		// long way sends it after the handshake.
		return nil, opErr(fmt.Errorf("%w: the first handshake message carries %d bytes of data outside a first flight", ErrAuth, len(payload)))
	case hs.Early:
		flags |= flagEarlyTaken
	default:
		// The listener does not take it (a replay of it could not be
		// told from the original: vlink's replay.go). The answer says
		// so, and the dialer sends it again after the handshake.
		payload = nil
	}
	if hs.OffersEarly {
		flags |= flagTakesEarly
	}
	var answer []byte
	if flags != 0 {
		answer = []byte{flags}
	}
	msg, cs1, cs2, err := st.WriteMessage(buf[headerSize:headerSize], answer)
	if err != nil {
		return nil, opErr(err)
	}
	if err := writeHandshake(c, buf[:headerSize+len(msg)]); err != nil {
		return nil, opErr(err)
	}
	send, recv, err := keys(hs, cs1, cs2, false)
	if err != nil {
		return nil, opErr(err)
	}
	cn := newConn(c, send, recv)
	cn.plain = payload // early data: the connection's first bytes
	return cn, nil
}

// The flags of the responder's answer, its payload's one byte (none from
// a responder from before early data, which reads as no flag).
const (
	flagEarlyTaken = 1 << 0 // the first message's data is the stream's first bytes
	flagTakesEarly = 1 << 1 // this listener takes early data in first flights
)

// initiate runs the initiator's side from its first message, sent alone.
func initiate(c net.Conn, hs layer.Handshake, opErr func(error) error) (send, recv *cipherState, flags byte, err error) {
	st, mutual, err := newState(hs, true, nil)
	if err != nil {
		return nil, nil, 0, opErr(err)
	}
	var buf [headerSize + maxHandshake]byte
	msg, _, _, err := st.WriteMessage(buf[headerSize:headerSize], nil)
	if err != nil {
		return nil, nil, 0, opErr(err)
	}
	if err := writeHandshake(c, buf[:headerSize+len(msg)]); err != nil {
		return nil, nil, 0, opErr(err)
	}
	return finishInitiator(c, hs, st, mutual, opErr)
}

// newState starts the handshake hs asks for (NNpsk0, NKpsk0 or KK, see
// handshake), bound to its transcript. rng makes the ephemeral key; nil
// is crypto/rand's.
func newState(hs layer.Handshake, initiator bool, rng io.Reader) (st *flynn.HandshakeState, mutual bool, err error) {
	// Both static keys known (members' certificates): KK, which needs
	// no pre-shared key.
	mutual = hs.Static.Private != nil && hs.PeerStatic != nil
	if len(hs.Key) < MinKeySize && !(mutual && hs.Key == nil) {
		return nil, false, fmt.Errorf("%w: got %d bytes, want at least %d", layer.ErrKeyRequired, len(hs.Key), MinKeySize)
	}
	cs, err := suiteFor(hs.AEAD)
	if err != nil {
		return nil, false, err
	}
	cfg := flynn.Config{
		CipherSuite: cs,
		Pattern:     flynn.HandshakeNN,
		Initiator:   initiator,
		Prologue:    Prologue(hs.Transcript),
		Random:      rng,
	}
	if hs.Key != nil {
		psk, err := hkdf.Key(sha256.New, hs.Key, nil, pskLabel, 32)
		if err != nil {
			return nil, false, err
		}
		cfg.PresharedKey, cfg.PresharedKeyPlacement = psk, 0
	}
	switch {
	case mutual:
		cfg.Pattern, cfg.PeerStatic = flynn.HandshakeKK, hs.PeerStatic
		cfg.StaticKeypair = flynn.DHKey{Private: hs.Static.Private, Public: hs.Static.Public}
	case initiator && hs.PeerStatic != nil:
		cfg.Pattern, cfg.PeerStatic = flynn.HandshakeNK, hs.PeerStatic
	case !initiator && hs.Static.Private != nil:
		cfg.Pattern, cfg.StaticKeypair = flynn.HandshakeNK, flynn.DHKey{Private: hs.Static.Private, Public: hs.Static.Public}
	}
	st, err = flynn.NewHandshakeState(cfg)
	return st, mutual, err
}

// finishInitiator reads the responder's message, which ends the
// handshake, and returns the keys and the answer's flags.
func finishInitiator(c net.Conn, hs layer.Handshake, st *flynn.HandshakeState, mutual bool, opErr func(error) error) (send, recv *cipherState, flags byte, err error) {
	var buf [headerSize + maxHandshake]byte
	msg, err := readHandshake(c, &buf, mutual)
	if err != nil {
		return nil, nil, 0, opErr(err)
	}
	answer, cs1, cs2, err := st.ReadMessage(nil, msg)
	if err != nil {
		return nil, nil, 0, opErr(fmt.Errorf("%w: %s (%v)", ErrAuth, failure(mutual), err))
	}
	if len(answer) > 0 {
		flags = answer[0] // bits not known here are for later versions
	}
	send, recv, err = keys(hs, cs1, cs2, true)
	if err != nil {
		return nil, nil, 0, opErr(err)
	}
	return send, recv, flags, nil
}

// keys makes the record keys of a completed handshake.
func keys(hs layer.Handshake, cs1, cs2 *flynn.CipherState, initiator bool) (send, recv *cipherState, err error) {
	if cs1 == nil || cs2 == nil {
		return nil, nil, fmt.Errorf("%w: handshake did not complete", ErrAuth)
	}
	sc, rc := cs1, cs2 // the initiator sends with the first
	if !initiator {
		sc, rc = cs2, cs1
	}
	if send, err = newCipherState(sc, hs.AEAD); err != nil {
		return nil, nil, err
	}
	if recv, err = newCipherState(rc, hs.AEAD); err != nil {
		return nil, nil, err
	}
	return send, recv, nil
}

// firstFlight runs the initiator's side with its first message sent
// together with the hello (layer.FirstFlight), carrying early (which may
// be empty): a handshake of one round trip, hello included, when the
// listener takes both; the long way, from the start, when it answers
// with a challenge. It reports whether early reached the listener's
// side: if not, the caller sends it again.
func firstFlight(c net.Conn, hs layer.Handshake, early []byte, opErr func(error) error) (send, recv *cipherState, taken bool, err error) {
	ff := hs.FirstFlight
	hs.FirstFlight = nil
	// The first message is the ephemeral key and the payload with its
	// tag, whatever the pattern (KK never comes here: members send no
	// first flight).
	n := headerSize + dhLen + len(early) + tagSize
	hs.Transcript = ff.Hello(n)
	st, mutual, err := newState(hs, true, nil)
	if err != nil {
		return nil, nil, false, opErr(err)
	}
	buf := make([]byte, headerSize, n)
	msg, _, _, err := st.WriteMessage(buf[headerSize:], early)
	if err != nil {
		return nil, nil, false, opErr(err)
	}
	if headerSize+len(msg) != n {
		return nil, nil, false, opErr(fmt.Errorf("the first message is %d bytes, not the %d the hello announced", headerSize+len(msg), n))
	}
	buf = buf[:n]
	(*header)(buf[:headerSize]).set(recHandshake, len(msg))
	if err := ff.Send(buf); err != nil {
		return nil, nil, false, err
	}
	long, fast, err := ff.Answer()
	if err != nil {
		return nil, nil, false, err
	}
	var flags byte
	if fast {
		send, recv, flags, err = finishInitiator(c, hs, st, mutual, opErr)
		if err != nil && len(early) > 0 {
			// A listener from before early data, put back at this
			// address, took the hello and refused the message: the
			// next dial sends none, and learns again.
			ff.TakesEarly(false)
		}
	} else {
		// The listener dropped the first message: start again under
		// the hello's whole exchange.
		send, recv, flags, err = initiate(c, long, opErr)
	}
	if err != nil {
		return nil, nil, false, err
	}
	ff.TakesEarly(flags&flagTakesEarly != 0)
	return send, recv, fast && flags&flagEarlyTaken != 0, nil
}

// firstRecord checks the handshake record that came with the hello and
// returns its message.
func firstRecord(rec []byte) ([]byte, error) {
	if len(rec) < headerSize {
		return nil, fmt.Errorf("%w: a first message of %d bytes", ErrAuth, len(rec))
	}
	h := (*header)(rec[:headerSize])
	if h.Type() != recHandshake || h.Len() != len(rec)-headerSize || h.Len() > maxRecord {
		return nil, fmt.Errorf("%w: expected a handshake record of %d bytes, got type %d of %d bytes", ErrAuth, len(rec)-headerSize, h[0], h.Len())
	}
	return rec[headerSize:], nil
}

// failure says why a handshake message did not authenticate.
func failure(mutual bool) string {
	if mutual {
		return "the peer does not hold its certificate's key, or saw another hello"
	}
	return "the peer does not hold this key, or saw another hello"
}

// Prologue is what both sides mix into the handshake: a label and the
// SHA-256 of the hello's transcript.
func Prologue(transcript []byte) []byte {
	sum := sha256.Sum256(transcript)
	return append([]byte(prologueLabel), sum[:]...)
}

// writeHandshake sends a handshake message that follows a header's room
// in rec.
func writeHandshake(c net.Conn, rec []byte) error {
	(*header)(rec).set(recHandshake, len(rec)-headerSize)
	_, err := c.Write(rec)
	return err
}

// readHandshake reads exactly one handshake record, never more: the
// records after it stay in c for the connection.
func readHandshake(c net.Conn, buf *[headerSize + maxHandshake]byte, mutual bool) ([]byte, error) {
	if _, err := io.ReadFull(c, buf[:headerSize]); err != nil {
		return nil, handshakeReadErr(err, mutual)
	}
	h := (*header)(buf[:headerSize])
	if h.Type() != recHandshake || h.Len() > maxHandshake {
		return nil, fmt.Errorf("%w: expected a handshake record, got type %d of %d bytes", ErrAuth, h[0], h.Len())
	}
	msg := buf[headerSize : headerSize+h.Len()]
	if _, err := io.ReadFull(c, msg); err != nil {
		return nil, handshakeReadErr(err, mutual)
	}
	return msg, nil
}

// handshakeReadErr explains an end of stream in the handshake: a peer
// that does not hold the key closes without a word.
func handshakeReadErr(err error, mutual bool) error {
	if (err == io.EOF || err == io.ErrUnexpectedEOF) && mutual {
		return fmt.Errorf("%w: the peer closed the connection in the handshake (does it hold its certificate's key?)", io.ErrUnexpectedEOF)
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: the peer closed the connection in the handshake (does it hold the same key?)", io.ErrUnexpectedEOF)
	}
	return err
}

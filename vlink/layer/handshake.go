package layer

import (
	"errors"
	"net"
)

// Handshake is what the hello that negotiated a filter established, for
// filters that bind to it ([HandshakeFilter]).
type Handshake struct {
	// Key is the pre-shared key of the dialer (vlink.Dialer.Key) or the
	// listener (vlink.Policy.Key); nil if there is none. It is the same
	// key on both sides only if the hello was authenticated with it.
	Key []byte
	// Transcript is the hello's messages exactly as they crossed the
	// connection, in order: the magic and the hello, then the challenge
	// and the proof if the listener asked for the key, then the accept.
	// Both sides see the same bytes unless someone changed them on the way.
	Transcript []byte
	// Static, on the listener's side, is its static X25519 key pair
	// (vlink.Policy.Identity) when the hello's accept announced the
	// public half, zero otherwise; PeerStatic, on the dialer's side, is
	// that public half as the accept carried it (the dialer has checked
	// it against its pins, vlink.Dialer.PeerKey), nil otherwise. An
	// encryption layer given either must prove the listener holds the
	// private half, or fail.
	//
	// Between members (vlink.Member), each side has both: Static is its
	// own certificate's key pair and PeerStatic the key of the
	// certificate the other side presented, which its trust accepted;
	// Key is then nil. The layer must prove each side holds its
	// private half, or fail.
	Static     KeyPair
	PeerStatic []byte
	// AEAD is the cipher the hello agreed on for an [AEADNegotiator]:
	// the listener's answer to the dialer's offer. AEADDefault if the
	// hello offered none.
	AEAD AEAD
	// FirstFlight, on the dialer's side only, is set when the hello has
	// not been sent yet and the filter sends it together with its own
	// first message: one round trip less, and the listener takes no
	// challenge round trip either (the hello's mark proves the key, the
	// filter's handshake gives freshness). Transcript is then empty: the
	// filter gets it from FirstFlight.Hello. Nil: the hello was answered
	// already, as Transcript says.
	FirstFlight FirstFlight
	// First, on the listener's side only, is the filter's first message
	// when it came with the hello (the dialer's FirstFlight): read off the
	// connection already, so the filter takes it from here. Transcript is
	// then the magic and the hello alone.
	First []byte
	// Early data: application bytes in the first message, so that a
	// request reaches the listener's target with the first flight.
	//
	// On the dialer's side, with FirstFlight, Early lets the filter
	// return before its handshake: a connection ([EarlyConn]) that keeps
	// what is written, up to what its first message holds, and sends it
	// there when its Handshake runs (or at the first Read, or once a
	// Write would not fit). Set only when the listener said it takes
	// early data (FirstFlight.TakesEarly) and the caller asked for it.
	//
	// On the listener's side, with First, Early says the listener takes
	// data in that first message: the filter returns it as the
	// connection's first bytes. Without it the filter drops the data and
	// its answer says so, and the dialer sends the bytes again once the
	// handshake is done. OffersEarly: the filter's answer tells the
	// dialer that this listener takes early data in its first flights.
	Early, OffersEarly bool
}

// An EarlyConn is a filter's connection whose handshake waits for the
// first bytes written (Handshake.Early). Handshake sends them in the
// first message with the hello, reads the answer, and reports the dial's
// error; it runs once, and the connection's Reads and Writes run it
// first if it has not run.
type EarlyConn interface {
	net.Conn
	Handshake() error
}

// A FirstFlighter is a HandshakeFilter that can send its first message
// together with the hello (Handshake.FirstFlight) when FirstFlight
// returns true. Package vlink offers it only to the filter at the bottom
// of a keyed hello's segment, straight above the hello.
type FirstFlighter interface {
	HandshakeFilter
	FirstFlight() bool
}

// A FirstFlight is a hello that waits to travel with the first message
// of the filter above it (Handshake.FirstFlight). The filter calls Hello,
// then Send, then Answer, once each and in that order:
//
//   - Hello returns the hello (the magic and its frame) announcing that
//     n bytes of the filter's follow it: the transcript the filter binds
//     its first message to;
//   - Send writes the hello and msg (n bytes) together;
//   - Answer reads the listener's answer. With fast true the listener
//     took the first message, and the filter reads its own answer next,
//     under the Handshake it was given. With fast false the listener
//     dropped it and authenticated the hello the long way (challenge,
//     proof, accept): the filter runs its handshake again from the start
//     under hs, whose Transcript is that whole exchange. An error is the
//     dial's (a refusal, a listener that failed its proof), to be
//     returned as it is.
//
// Once the filter's handshake is done, it calls TakesEarly with what the
// listener's answer said: whether it takes early data (Handshake.Early)
// in its first flights, for the dialer to remember.
type FirstFlight interface {
	Hello(n int) []byte
	Send(msg []byte) error
	Answer() (hs Handshake, fast bool, err error)
	TakesEarly(ok bool)
}

// A KeyPair is an X25519 key pair, 32 bytes each half.
type KeyPair struct {
	Private, Public []byte
}

// A HandshakeFilter is a Filter that needs the pre-shared key and the
// transcript of the hello that negotiated it: an encryption layer keys
// its channel with the key and binds it to the transcript, so that the
// authenticated hello and the channel cannot be split. Package vlink
// calls ClientHandshake and ServerHandshake instead of Client and Server,
// within the handshake's deadline, and refuses a stack holding such a
// layer when its side has no key ([ErrKeyRequired]).
type HandshakeFilter interface {
	Filter
	ClientHandshake(c net.Conn, hs Handshake) (net.Conn, error)
	ServerHandshake(c net.Conn, hs Handshake) (net.Conn, error)
}

// ErrKeyRequired is matched when a stack holds a layer that needs the
// pre-shared key (a HandshakeFilter) and no key is configured. Package
// vlink returns the same error as vlink.ErrKeyRequired.
var ErrKeyRequired = errors.New("layer needs a pre-shared key")

// A ChannelBinder is a connection whose factory secured the channel
// itself (QUIC's TLS 1.3). ChannelBinding returns a value both ends of
// that channel compute alike and a man in the middle cannot make alike
// on his two sides (a TLS exporter, as RFC 9266's tls-exporter binding).
// Package vlink covers it with the hello's proofs of the pre-shared key,
// so a keyed dialer and listener refuse a channel someone sits in.
type ChannelBinder interface {
	ChannelBinding() []byte
}

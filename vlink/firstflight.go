package vlink

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// A dialer that holds a key proves it in its first flight, before the
// challenge: the second half of its hello's nonce is a MAC of the hello
// under the key the challenge will ask for (the mark). A keyed listener
// reads it from the bytes waiting in the socket, without a goroutine or a
// read, and under load gives handshake slots only to marked hellos, as
// WireGuard answers nothing without its mac1: a dialer without the key
// can then wait for a free slot, never take one from a key holder.
//
// The mark alone proves the key, not freshness: someone who recorded a
// marked hello can replay it, and it passes the mark. So it decides only
// which hellos get a handshake slot under load, and, with the record of
// the marks already taken (replay.go), which hellos skip the challenge
// (the first flight, below); any other hello still meets the challenge.
// It costs the listener one HMAC per hello it looks at, and keeps the
// wire format: a listener that does not check it sees a nonce, half of
// it random (128 bits, fresh enough for a nonce the listener's own
// challenge makes unique anyway), and a dialer that does not make one
// sends a hello that is simply unmarked.
const (
	labelMark = "vlink-v1 first flight\x00"
	markSize  = nonceSize / 2
)

// markAt returns where the mark lies in a hello body: the offset of the
// nonce value's second half, or -1 if the body has no nonce. The body
// must have decoded (decodeBody), so its fields are well formed.
func markAt(body []byte) int {
	for off := 0; off+fieldHeader <= len(body); {
		tag, n := fieldTag(body[off]), int(binary.BigEndian.Uint16(body[off+1:]))
		off += fieldHeader
		if tag == tagNonce && n == nonceSize && off+n <= len(body) {
			return off + nonceSize - markSize
		}
		off += n
	}
	return -1
}

// mark computes the mark of a hello body under key, as if the mark's
// own bytes were zero.
func mark(key, body []byte, at int) []byte {
	var zero [markSize]byte
	m := hmac.New(sha256.New, key)
	m.Write([]byte(labelMark))
	m.Write(body[:at])
	m.Write(zero[:])
	m.Write(body[at+markSize:])
	return m.Sum(nil)[:markSize]
}

// sealMark writes the mark of a hello body under key into its nonce.
func sealMark(key, body []byte) {
	if at := markAt(body); at >= 0 {
		copy(body[at:], mark(key, body, at))
	}
}

// marked reports whether a hello body, decoded as m, carries the mark of
// the key its proof will need on this listener.
func (l *Listener) marked(c net.Conn, m *message, body []byte) bool {
	key := l.cfg.Policy.Key
	switch v, _ := c.(Vouched); {
	case m.nonce == nil:
		return false
	case v != nil:
		key = v.VouchedKey()
	case m.node != "" && key != nil:
		key = NodeKey(key, m.node)
	}
	at := markAt(body)
	return key != nil && at >= 0 && hmac.Equal(body[at:at+markSize], mark(key, body, at))
}

// markedFirstFlight reports whether b, the first bytes waiting in c,
// hold the magic and a whole hello that carries its mark.
func (l *Listener) markedFirstFlight(c net.Conn, b []byte) bool {
	if len(b) < len(magic)+headerSize || string(b[:len(magic)]) != magic {
		return false
	}
	h := header(b[len(magic):])
	if h.Version() != protoVersion || h.Type() != msgHello || h.Len() > maxBody || len(b) < len(magic)+headerSize+h.Len() {
		return false
	}
	body := b[len(magic)+headerSize : len(magic)+headerSize+h.Len()]
	m, err := decodeBody(msgHello, body)
	return err == nil && l.marked(c, m, body)
}

// A keyed hello whose segment's bottom layer can send its first message
// with it (layer.FirstFlighter: noise) carries the first field, and that
// message follows it at once: the dialer asks for no challenge. The
// listener takes the two together when the hello's mark proves the key
// and the hello is fresh (replay.go): it answers with its accept and the
// layer's answer at once, so a keyed, encrypted connection costs one
// round trip where it cost three (hello and challenge, proof and accept,
// the layer's handshake). Anything else (no mark, an old hello, a cipher
// or a static key the listener would not choose) it answers the long
// way: it drops the first message and sends its challenge, and the layer
// runs its handshake again once the hello is accepted.

// firstFlight is the dialer's side: the hello it sends with the layer's
// first message (layer.FirstFlight).
type firstFlight struct {
	d       *helloDialer
	c       net.Conn
	network string
	hello   *message
	key     []byte
	buf     []byte // the hello's bytes, once Hello made them
	// err is the dial's error when the answer failed: the filter
	// returns it, and the dial returns it as it is.
	err error
}

var _ layer.FirstFlight = (*firstFlight)(nil)

func (f *firstFlight) Hello(n int) []byte {
	f.hello.first.length = uint32(n)
	f.hello.first.time = uint64(time.Now().UnixMilli())
	f.buf = helloBytes(f.hello, f.key)
	return f.buf
}

func (f *firstFlight) Send(msg []byte) error {
	b := append(f.buf[:len(f.buf):len(f.buf)], msg...)
	if _, err := f.c.Write(b); err != nil {
		return f.fail(fmt.Errorf("sending hello: %w", err))
	}
	return nil
}

func (f *firstFlight) Answer() (layer.Handshake, bool, error) {
	transcript, acc, fast, err := clientAnswer(f.c, f.hello, f.buf, f.key, nil)
	if err != nil {
		return layer.Handshake{}, false, f.fail(err)
	}
	hs := layer.Handshake{Key: f.key, Transcript: transcript, PeerStatic: f.hello.first.static, AEAD: f.hello.first.aead}
	if !fast {
		hs.PeerStatic, hs.AEAD = acc.static, layer.AEADDefault
		if acc.aeads != nil {
			hs.AEAD = layer.AEAD(acc.aeads[0])
		}
	}
	if f.d.peerKey != nil {
		if err := f.d.peerKey(f.d.peer, hs.PeerStatic); err != nil {
			return layer.Handshake{}, false, f.fail(err)
		}
	}
	if !fast && f.d.statics != nil {
		f.d.statics.set(f.d.peer, hs.PeerStatic) // for the next first flight
	}
	return hs, fast, nil
}

func (f *firstFlight) TakesEarly(ok bool) { f.d.statics.setEarly(f.d.peer, ok) }

// fail makes err the dial's, as helloDialer returns the failures of a
// hello, and returns it.
func (f *firstFlight) fail(err error) error {
	if f.err == nil {
		f.err = &net.OpError{Op: "dial", Net: "vlink", Source: f.c.LocalAddr(), Addr: addr{f.network, f.d.peer}, Err: err}
	}
	return f.err
}

// firstFlighter reports whether the bottom layer of seg, the one straight
// above its hello, sends its first message with the hello.
func firstFlighter(seg []Layer) bool {
	if len(seg) == 0 {
		return false
	}
	_, v, err := seg[len(seg)-1].build()
	if err != nil {
		return false
	}
	ff, ok := v.(layer.FirstFlighter)
	return ok && ff.FirstFlight()
}

// takesFirst reports whether the listener takes the first flight of
// hello m (body helloBody) on c, read straight from the connection
// (neither nested nor forwarded), whose mark proved the key: the hello
// is fresh and asks for what the long way would give it (the cipher the
// listener would choose, its static key). Else the listener answers the
// long way.
func (l *Listener) takesFirst(c net.Conn, m *message, body []byte) bool {
	if _, vouched := c.(Vouched); vouched || l.cfg.Policy.Key == nil || m.cert != nil || m.nonce == nil || m.lookup || m.dgram ||
		len(m.hops) > 0 || m.trail != nil || m.origin != "" || channelBinding(c) != nil {
		return false
	}
	st, err := Parse(m.stack)
	if err != nil {
		return false
	}
	if mirrored := st.mirrored(); len(mirrored) == 0 || mirrored[len(mirrored)-1].Name != EncryptionLayer {
		return false
	}
	aead := layer.AEADDefault
	if m.aeads != nil {
		aead = layer.ChooseAEAD(aeadsOf(m.aeads))
	}
	if m.first.aead != aead || !bytes.Equal(m.first.static, l.static) {
		return false
	}
	at := markAt(body)
	return l.replay.fresh(body[at:at+markSize], m.first.time, time.Now())
}

// readFirst reads the first message that follows hello m: into h.first
// when the listener takes it, else to drop it.
func (l *Listener) readFirst(c net.Conn, m *message, h *Hello, take bool) error {
	n := int64(m.first.length)
	if !take {
		_, err := io.CopyN(io.Discard, c, n)
		return err
	}
	h.first = make([]byte, n)
	_, err := io.ReadFull(c, h.first)
	return err
}

// staticKeys remembers, per listener address, the static key (identity)
// a listener announced in its accept and the dialer's PeerKey callback
// took, so that the next first flight to it can name the key and run
// NKpsk0 at once: a listener with an identity takes no first flight that
// names another key or none. Before a first contact in this process,
// the Dialer's PinnedKey gives the key a pin file holds, if it has one.
// The guess costs nothing when wrong: the listener
// answers the long way, its accept says its key, the callback checks it
// as on the first contact, and the guess is replaced. With the key, it
// remembers whether the listener's last answer said it takes early data
// (layer.FirstFlight.TakesEarly): a listener from before early data
// refuses a first message that carries some.
type staticKeys struct {
	mu sync.Mutex
	m  map[string]staticKey
}

type staticKey struct {
	key   []byte
	early bool // the listener takes early data
}

// maxStaticKeys bounds the listeners remembered; past it the memory
// starts again (a dialer that reaches that many gateways with
// identities pays one long way more per gateway).
const maxStaticKeys = 4096

func (s *staticKeys) get(address string) []byte {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[address].key
}

// takesEarly reports whether the listener at address has an identity
// this Dialer knows and said it takes early data.
func (s *staticKeys) takesEarly(address string) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.m[address]
	return k.key != nil && k.early
}

// set remembers key for address, and forgets whether it takes early
// data until its answer says; nil forgets it.
func (s *staticKeys) set(address string, key []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case key == nil:
		delete(s.m, address)
		return
	case s.m == nil || len(s.m) >= maxStaticKeys:
		s.m = make(map[string]staticKey)
	}
	s.m[address] = staticKey{key: key}
}

// setEarly remembers whether the listener at address, whose key is
// known, takes early data.
func (s *staticKeys) setEarly(address string, ok bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, known := s.m[address]; known && k.early != ok {
		k.early = ok
		s.m[address] = k
	}
}

package vlink

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"net"
)

// A dialer that holds a key proves it in its first flight, before the
// challenge: the second half of its hello's nonce is a MAC of the hello
// under the key the challenge will ask for (the mark). A keyed listener
// reads it from the bytes waiting in the socket, without a goroutine or a
// read, and under load gives handshake slots only to marked hellos, as
// WireGuard answers nothing without its mac1: a dialer without the key
// can then wait for a free slot, never take one from a key holder.
//
// The mark proves nothing on its own: the challenge that follows does.
// It costs the listener one HMAC per hello it looks at, and keeps the
// wire format: a listener that does not check it sees a nonce, half of
// it random (128 bits, fresh enough for a nonce the listener's own
// challenge makes unique anyway), and a dialer that does not make one
// sends a hello that is simply unmarked. Someone who recorded a marked
// hello can replay it: it passes the mark, and fails the challenge.
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

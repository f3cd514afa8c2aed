package nodecert

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vlink-dev/vlink/internal/nodename"
)

// Binary form of a certificate, version 1:
//
//	certificate = body | signature
//	body        = version u8 | kind u8 | notBefore u64 | notAfter u64 |
//	              nodeKey [32] | issuer [32] |
//	              nameLen u8 | name | groupCount u8 | *( groupLen u8 | group )
//	signature   = [64] Ed25519, by issuer, over signingLabel ‖ body
//
// Integers are big-endian. notBefore and notAfter are unix seconds; 0
// leaves that bound open (valid from any time; never expires), and when
// both are set notBefore < notAfter. nodeKey is the node's X25519 static
// public key; issuer is the owner's Ed25519 public key. name follows the
// node-name rule (1..63 bytes); groups follow it too, at most MaxGroups,
// in strictly increasing byte order (sorted, no duplicates).
//
// The form is canonical: one certificate has exactly one encoding, and
// Parse refuses anything else (another version or kind, a length out of
// range, groups out of order, a bound past year 9999, trailing bytes), so
// a certificate's fingerprint, the SHA-256 of its encoding, names it for
// revocation and no reencoding escapes a revocation list. Ed25519
// signatures are deterministic and Go's verifier refuses non-canonical
// ones, so the signature part cannot be varied either.
const (
	// Version is the certificate format this package writes and reads.
	Version = 1

	// KeySize is the size of a node's public key (X25519).
	KeySize = 32
	// OwnerKeySize is the size of an owner's public key (Ed25519).
	OwnerKeySize = ed25519.PublicKeySize
	// SignatureSize is the size of the owner's signature (Ed25519).
	SignatureSize = ed25519.SignatureSize

	// MaxNameLen bounds a node's name: one DNS label, as every vlink node
	// name is (vlink.ValidNodeName).
	MaxNameLen = nodename.MaxLen
	// MaxGroupLen bounds a group's name, which follows the node-name rule.
	MaxGroupLen = nodename.MaxLen
	// MaxGroups bounds the groups of one certificate: enough for roles and
	// sites, and it keeps the largest certificate near 2 KB.
	MaxGroups = 32

	// fixedSize is the body up to the name: version, kind, the two bounds,
	// the node's key and the issuer's.
	fixedSize = 1 + 1 + 8 + 8 + KeySize + OwnerKeySize
	// minSize is a certificate with a one-byte name and no groups.
	minSize = fixedSize + 1 + 1 + 1 + SignatureSize
	// MaxSize bounds an encoded certificate: the longest name and the most
	// groups of the longest names.
	MaxSize = fixedSize + 1 + MaxNameLen + 1 + MaxGroups*(1+MaxGroupLen) + SignatureSize

	// maxUnix is the last second of year 9999, the latest bound accepted,
	// so every bound converts to a time.Time and prints in RFC 3339.
	maxUnix = 253402300799

	// signingLabel is signed before the body and never sent: an owner's
	// signature over a certificate can never pass for its signature over
	// anything else the owner key may come to sign.
	signingLabel = "vlink-v1 node certificate\x00"
)

// appendBody appends the encoding of the fields a certificate signs.
// The fields must be valid (checkTemplate, or Parse, made them so).
func appendBody(b []byte, t *Template, nb, na uint64, issuer OwnerPublicKey) []byte {
	b = append(b, Version, byte(t.Kind))
	b = binary.BigEndian.AppendUint64(b, nb)
	b = binary.BigEndian.AppendUint64(b, na)
	b = append(b, t.PublicKey...)
	b = append(b, issuer[:]...)
	b = append(b, byte(len(t.Name)))
	b = append(b, t.Name...)
	b = append(b, byte(len(t.Groups)))
	for _, g := range t.Groups {
		b = append(b, byte(len(g)))
		b = append(b, g...)
	}
	return b
}

// signedMessage is what the owner signs: the label and the body.
func signedMessage(body []byte) []byte {
	m := make([]byte, 0, len(signingLabel)+len(body))
	return append(append(m, signingLabel...), body...)
}

// decoder reads the body front to back; the first error sticks, so the
// fields can be read in a row and the error checked once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("nodecert: %w certificate: "+format, append([]any{ErrMalformed}, args...)...)
	}
}

func (d *decoder) bytes(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.fail("truncated in the %s", what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8(what string) byte {
	v := d.bytes(1, what)
	if v == nil {
		return 0
	}
	return v[0]
}

func (d *decoder) u64(what string) uint64 {
	v := d.bytes(8, what)
	if v == nil {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// label reads a length-prefixed name that must satisfy the node-name
// rule, which also bounds its length.
func (d *decoder) label(what string) string {
	n := d.u8(what + " length")
	s := string(d.bytes(int(n), what))
	if d.err == nil && !nodename.Valid(s) {
		d.fail("%s %q is not a valid name", what, s)
	}
	return s
}

// Parse decodes a certificate from its binary form (Certificate.Marshal),
// strictly: every deviation from the one canonical encoding is an error
// matching ErrMalformed. Parse does not check the signature; Verify or a
// Trust does.
func Parse(data []byte) (*Certificate, error) {
	if len(data) < minSize || len(data) > MaxSize {
		return nil, fmt.Errorf("nodecert: %w certificate: %d bytes, want %d to %d", ErrMalformed, len(data), minSize, MaxSize)
	}
	d := &decoder{b: data[:len(data)-SignatureSize]}
	if v := d.u8("version"); v != Version {
		return nil, fmt.Errorf("nodecert: %w certificate: format version %d, want %d", ErrMalformed, v, Version)
	}
	c := &Certificate{}
	c.kind = Kind(d.u8("kind"))
	if c.kind != KindNode && c.kind != KindRelay {
		d.fail("unknown kind %d", c.kind)
	}
	nb, na := d.u64("not-before"), d.u64("not-after")
	switch {
	case nb > maxUnix || na > maxUnix:
		d.fail("a validity bound is past year 9999")
	case nb != 0 && na != 0 && nb >= na:
		d.fail("valid from %d to %d: not after it starts", nb, na)
	}
	c.notBefore, c.notAfter = fromUnix(nb), fromUnix(na)
	copy(c.key[:], d.bytes(KeySize, "node key"))
	copy(c.issuer[:], d.bytes(OwnerKeySize, "issuer"))
	c.name = d.label("name")
	n := int(d.u8("group count"))
	if n > MaxGroups {
		d.fail("%d groups, at most %d", n, MaxGroups)
	}
	for i := 0; i < n && d.err == nil; i++ {
		g := d.label("group")
		if i > 0 && g <= c.groups[i-1] {
			d.fail("group %q after %q: groups are sorted, each once", g, c.groups[i-1])
		}
		c.groups = append(c.groups, g)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes between the groups and the signature", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	c.raw = append([]byte(nil), data...)
	c.sum = sha256.Sum256(c.raw)
	return c, nil
}

// fromUnix maps an encoded bound to a time, 0 to the zero time (open).
func fromUnix(s uint64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(int64(s), 0).UTC()
}

// toUnix maps a template's bound to its encoding: the zero time to 0,
// others to whole seconds (truncated) from 1970 to year 9999.
func toUnix(t time.Time, what string) (uint64, error) {
	if t.IsZero() {
		return 0, nil
	}
	s := t.Unix()
	if s < 1 || s > maxUnix {
		return 0, fmt.Errorf("nodecert: %w: %s %v is not between 1970 and year 9999", ErrInvalidTemplate, what, t)
	}
	return uint64(s), nil
}

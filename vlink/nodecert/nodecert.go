// Package nodecert is the certificates of a vlink network's nodes: names
// proven by the network owner's signature instead of by a key every node
// shares (issue 37's node identities).
//
// The owner of a network holds an Ed25519 key, its certificate authority
// (NewOwner). Each node makes its own X25519 static key, the one the noise
// layer uses (vlink.NewIdentity), and never shows the private half; the
// owner signs the public half into a Certificate binding the node's name,
// its groups, its kind (a node, or a relay, which holds a certificate
// too) and a validity (Sign). A node presents its certificate; whoever
// holds the owner's public key checks it (Certificate.Verify), and a Trust
// adds a revocation list, reloadable while running, so that a certificate
// expired or revoked is refused everywhere. Rules say which nodes may
// reach which, by name and group, as Nebula's firewall or Tailscale's
// ACLs do.
//
// Keys and certificates are kept in PEM files: "VLINK OWNER PRIVATE KEY"
// (the key's 32-byte Ed25519 seed; the file must be of mode 600),
// "VLINK OWNER PUBLIC KEY" and "VLINK NODE CERTIFICATE" (the binary form,
// whose layout is documented with Version). A revocation list is a text file of certificate
// fingerprints (ParseRevocations).
//
// The design follows Nebula's certificates (a CA key signs each host's
// name, groups and validity; fingerprints; a blocklist) and
// golang.org/x/crypto/ssh's (a compact binary form, the signer's key in
// the certificate): one small canonical encoding, so that a fingerprint
// names one certificate.
package nodecert

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/internal/nodename"
)

// Errors. Parse and the PEM and revocation-list readers fail with errors
// matching ErrMalformed; Sign with ErrInvalidTemplate; Verify and
// Trust.Check with a *CertificateError matching one of the others.
var (
	ErrMalformed       = errors.New("malformed")
	ErrInvalidTemplate = errors.New("invalid certificate template")
	ErrWrongIssuer     = errors.New("not issued by this network's owner")
	ErrBadSignature    = errors.New("bad signature")
	ErrExpired         = errors.New("expired")
	ErrNotYetValid     = errors.New("not yet valid")
	ErrRevoked         = errors.New("revoked")
)

// A CertificateError is a certificate refused by Verify or Trust.Check;
// Err says why and matches one of ErrWrongIssuer, ErrBadSignature,
// ErrExpired, ErrNotYetValid or ErrRevoked. Until the signature is
// checked, the name in Cert is only what the certificate claims.
type CertificateError struct {
	Cert *Certificate
	Err  error
}

func (e *CertificateError) Error() string {
	return fmt.Sprintf("nodecert: certificate %s of %s %s: %v", e.Cert.Fingerprint(), e.Cert.kind, e.Cert.name, e.Err)
}

func (e *CertificateError) Unwrap() error { return e.Err }

// A Kind is what a certificate lets its holder be. The zero Kind is a
// node, the lesser of them, so that a relay is never made by omission.
type Kind uint8

const (
	KindNode  Kind = 0 // a node: registers at relays, dials and accepts
	KindRelay Kind = 1 // a relay: nodes register at it
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindRelay:
		return "relay"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// A Template is what Sign binds into a certificate.
type Template struct {
	Name   string   // the node's name (vlink.ValidNodeName)
	Groups []string // each ValidGroup, at most MaxGroups, in any order, each once
	Kind   Kind
	// PublicKey is the node's X25519 static public key, KeySize bytes
	// (vlink.IdentityPublic of the node's vlink.NewIdentity).
	PublicKey []byte
	// NotBefore and NotAfter bound when the certificate is valid: from
	// NotBefore (inclusive) to NotAfter (exclusive), in whole seconds
	// (truncated). The zero time leaves a bound open: valid from any
	// time, or never expires.
	NotBefore time.Time
	NotAfter  time.Time
}

// ValidGroup reports whether name can name a group: the rule of node
// names (1 to 63 lower-case letters, digits and '-', starting with a
// letter and not ending with '-'), so that a rule's "group:NAME" is never
// ambiguous and names print safely.
func ValidGroup(name string) bool { return nodename.Valid(name) }

// A Certificate is a node's public key bound to its name, groups, kind
// and validity by the owner's signature. It is immutable: made by Sign or
// Parse, read through its methods, so that what Verify checks is what
// the methods return.
type Certificate struct {
	name                string
	groups              []string
	kind                Kind
	key                 [KeySize]byte
	notBefore, notAfter time.Time
	issuer              OwnerPublicKey
	raw                 []byte            // the encoding, signature last
	sum                 [sha256.Size]byte // SHA-256 of raw: the fingerprint
}

// Sign makes the certificate of t, signed by owner. t's groups are sorted
// in the certificate; a group given twice is an error.
func Sign(owner *OwnerKey, t Template) (*Certificate, error) {
	if owner == nil || len(owner.priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("nodecert: %w: no owner key", ErrInvalidTemplate)
	}
	nb, na, err := checkTemplate(&t)
	if err != nil {
		return nil, err
	}
	body := appendBody(make([]byte, 0, MaxSize), &t, nb, na, owner.Public())
	sig := ed25519.Sign(owner.priv, signedMessage(body))
	// Parsing what was signed guarantees that Sign makes only what Parse
	// accepts, and the certificate returned is the one a peer will see.
	return Parse(append(body, sig...))
}

// checkTemplate validates t, sorting a copy of its groups in place of
// them, and returns its bounds as encoded.
func checkTemplate(t *Template) (nb, na uint64, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("nodecert: %w: "+format, append([]any{ErrInvalidTemplate}, args...)...)
	}
	if !nodename.Valid(t.Name) {
		return 0, 0, bad("name %q: want 1..%d lower-case letters, digits and '-', starting with a letter and not ending with '-'", t.Name, MaxNameLen)
	}
	if t.Kind != KindNode && t.Kind != KindRelay {
		return 0, 0, bad("unknown %v", t.Kind)
	}
	if len(t.PublicKey) != KeySize {
		return 0, 0, bad("public key of %d bytes, want an X25519 key of %d", len(t.PublicKey), KeySize)
	}
	if [KeySize]byte(t.PublicKey) == [KeySize]byte{} {
		return 0, 0, bad("all-zero public key")
	}
	if len(t.Groups) > MaxGroups {
		return 0, 0, bad("%d groups, at most %d", len(t.Groups), MaxGroups)
	}
	t.Groups = slices.Clone(t.Groups)
	slices.Sort(t.Groups)
	for i, g := range t.Groups {
		if !ValidGroup(g) {
			return 0, 0, bad("group %q: want 1..%d lower-case letters, digits and '-', starting with a letter and not ending with '-'", g, MaxGroupLen)
		}
		if i > 0 && g == t.Groups[i-1] {
			return 0, 0, bad("group %q given twice", g)
		}
	}
	if nb, err = toUnix(t.NotBefore, "not-before"); err != nil {
		return 0, 0, err
	}
	if na, err = toUnix(t.NotAfter, "not-after"); err != nil {
		return 0, 0, err
	}
	if nb != 0 && na != 0 && nb >= na {
		return 0, 0, bad("not-after %v is not after not-before %v", fromUnix(na), fromUnix(nb))
	}
	return nb, na, nil
}

// Verify checks that owner issued c and that c is valid at now: its
// issuer is owner, the owner's signature holds, and now is within its
// bounds. The error is a *CertificateError (or matches ErrMalformed for
// a Certificate not made by Sign or Parse). Verify does not consult a
// revocation list; a Trust does.
func (c *Certificate) Verify(owner OwnerPublicKey, now time.Time) error {
	refuse := func(format string, args ...any) error {
		return &CertificateError{Cert: c, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case len(c.raw) < minSize:
		return fmt.Errorf("nodecert: %w certificate: not made by Sign or Parse", ErrMalformed)
	case owner == OwnerPublicKey{}:
		// Never trust the zero key: it is of small order, and signatures
		// can be forged for such keys.
		return refuse("%w: no owner key to verify with", ErrWrongIssuer)
	case c.issuer != owner:
		return refuse("%w: issued by %s, this network's owner is %s", ErrWrongIssuer, c.issuer.Fingerprint(), owner.Fingerprint())
	}
	body, sig := c.raw[:len(c.raw)-SignatureSize], c.raw[len(c.raw)-SignatureSize:]
	if !ed25519.Verify(owner[:], signedMessage(body), sig) {
		return refuse("%w", ErrBadSignature)
	}
	return c.checkTime(now)
}

// checkTime checks that now is within c's bounds.
func (c *Certificate) checkTime(now time.Time) error {
	refuse := func(format string, args ...any) error {
		return &CertificateError{Cert: c, Err: fmt.Errorf(format, args...)}
	}
	if !c.notBefore.IsZero() && now.Before(c.notBefore) {
		return refuse("%w: valid from %s, now is %s", ErrNotYetValid, stamp(c.notBefore), stamp(now))
	}
	if !c.notAfter.IsZero() && !now.Before(c.notAfter) {
		return refuse("%w at %s, now is %s", ErrExpired, stamp(c.notAfter), stamp(now))
	}
	return nil
}

// Name is the node's name.
func (c *Certificate) Name() string { return c.name }

// Groups are the node's groups, sorted; the slice is the caller's.
func (c *Certificate) Groups() []string { return slices.Clone(c.groups) }

// InGroup reports whether the node is in group g.
func (c *Certificate) InGroup(g string) bool {
	_, found := slices.BinarySearch(c.groups, g)
	return found
}

// Kind is what the certificate lets its holder be.
func (c *Certificate) Kind() Kind { return c.kind }

// PublicKey is the node's X25519 static public key; the slice is the
// caller's.
func (c *Certificate) PublicKey() []byte { return slices.Clone(c.key[:]) }

// NotBefore is when the certificate becomes valid; the zero time if
// always.
func (c *Certificate) NotBefore() time.Time { return c.notBefore }

// NotAfter is when the certificate expires; the zero time if never.
func (c *Certificate) NotAfter() time.Time { return c.notAfter }

// Issuer is the public key of the owner that signed the certificate, as
// the certificate claims it: Verify checks the claim.
func (c *Certificate) Issuer() OwnerPublicKey { return c.issuer }

// Marshal is the certificate's binary form, as Parse reads it; the slice
// is the caller's.
func (c *Certificate) Marshal() []byte { return slices.Clone(c.raw) }

// Fingerprint names the certificate, in revocation lists and logs:
// "SHA256:" and the unpadded base64 of the SHA-256 of its binary form.
func (c *Certificate) Fingerprint() string {
	return fingerprintPrefix + base64.RawStdEncoding.EncodeToString(c.sum[:])
}

// String describes the certificate for people, one field a line, as
// `vlink cert show` prints it.
func (c *Certificate) String() string {
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%-12s %s\n", k+":", v) }
	line("name", c.name)
	line("kind", c.kind.String())
	groups := "none"
	if len(c.groups) > 0 {
		groups = strings.Join(c.groups, ", ")
	}
	line("groups", groups)
	line("node key", fingerprint(c.key[:]))
	line("valid", validity(c.notBefore, c.notAfter))
	line("issuer", c.issuer.Fingerprint())
	line("fingerprint", c.Fingerprint())
	return b.String()
}

func validity(nb, na time.Time) string {
	switch {
	case nb.IsZero() && na.IsZero():
		return "always"
	case nb.IsZero():
		return "until " + stamp(na)
	case na.IsZero():
		return "from " + stamp(nb) + ", no expiry"
	}
	return "from " + stamp(nb) + " until " + stamp(na)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// fingerprint is how vlink shows keys and certificates to people:
// "SHA256:" and the unpadded base64 of the SHA-256, as OpenSSH does and
// as knownnodes.Fingerprint shows a listener's key.
func fingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	return fingerprintPrefix + base64.RawStdEncoding.EncodeToString(sum[:])
}

const fingerprintPrefix = "SHA256:"

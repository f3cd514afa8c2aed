package vlink

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/vlink-dev/vlink/vlink/layer"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// A Member makes a dialer (Dialer.Member) or a listener (Policy.Member) a
// member of a vlink network that has an owner: its certificate, which the
// owner signed (package vlink/nodecert), the private half of the key the
// certificate binds, and the trust that checks the certificates of peers.
//
// A member's hello carries its certificate instead of proving a shared
// key, and its peer answers with its own; each checks the other's
// against Trust (the owner's signature, the validity, the revocation
// list), and the encryption layer, which must be in the hello's segment,
// proves that each holds its certificate's private key (Noise KK, both
// static keys known from the certificates). No secret is shared: a relay
// that carries a connection between two members holds no key that opens
// it, and a member proves only the name its certificate gives it.
type Member struct {
	// Cert is the member's certificate.
	Cert *nodecert.Certificate
	// Private is the X25519 private key whose public half Cert binds
	// (NewIdentity made it, on the member's machine).
	Private []byte
	// Trust checks peers' certificates: the owner's key, and the
	// revocation list, reloaded when Trust.Reload is called.
	Trust *nodecert.Trust
	// Rules say which members may reach this one, and on which ports:
	// a listener with this Member checks every member's hello against
	// them (the dialer's certificate, this member's, the port of the
	// hello's target; 0 for a hello that names none, which only a
	// rule for all ports allows) and refuses the others, whatever a
	// relay decided. Nil or empty allows every member the trust
	// accepts.
	Rules *nodecert.Rules
}

// ErrNotMember is matched by the errors of a Member that cannot be used:
// no certificate, a private key that is not the certificate's, a
// certificate the member's own trust refuses.
var ErrNotMember = errors.New("not a usable network member")

// Validate reports whether m is usable: its key is its certificate's,
// and its own trust accepts its certificate now (a member whose
// certificate expired or was revoked would be refused by every peer).
func (m *Member) Validate() error {
	switch {
	case m.Cert == nil:
		return fmt.Errorf("%w: no certificate", ErrNotMember)
	case m.Trust == nil:
		return fmt.Errorf("%w: no trust (the owner's public key) to check peers with", ErrNotMember)
	}
	pub, err := IdentityPublic(m.Private)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if subtle.ConstantTimeCompare(pub, m.Cert.PublicKey()) != 1 {
		return fmt.Errorf("%w: the private key is not the one the certificate of %s binds: sign the public half of this key (vlink key --pub), or use the key the certificate was made for", ErrNotMember, m.Cert.Name())
	}
	if err := m.Trust.Check(m.Cert, time.Now()); err != nil {
		return fmt.Errorf("%w: its own certificate: %w", ErrNotMember, err)
	}
	return nil
}

// peer parses and checks a certificate a peer presented.
func (m *Member) peer(raw []byte) (*nodecert.Certificate, error) {
	c, err := nodecert.Parse(raw)
	if err != nil {
		return nil, err
	}
	if err := m.Trust.Check(c, time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

// keyPair is m's static key pair, for the encryption layer.
func (m *Member) keyPair() layer.KeyPair {
	return layer.KeyPair{Private: m.Private, Public: m.Cert.PublicKey()}
}

// A PeerCertCallback checks further the certificate of the listener at
// address, which the dialer's Member.Trust has already accepted (owner,
// validity, revocation) and, for a node reached through its network,
// whose name is the node's. An error fails the dial. A node's
// connection to its relay requires a relay's certificate this way.
type PeerCertCallback func(address string, cert *nodecert.Certificate) error

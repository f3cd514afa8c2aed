// Package testmember makes networks with an owner, and their members,
// for tests: an owner key, a trust in it, and members with fresh keys
// and certificates the owner signed.
package testmember

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// A Network is an owner and the trust its members check each other with.
type Network struct {
	tb    testing.TB
	Owner *nodecert.OwnerKey
	Trust *nodecert.Trust
}

// New returns a network with a fresh owner and no revocation list.
func New(tb testing.TB) *Network {
	tb.Helper()
	owner, err := nodecert.NewOwner()
	if err != nil {
		tb.Fatal(err)
	}
	trust, err := nodecert.NewTrust(owner.Public(), "")
	if err != nil {
		tb.Fatal(err)
	}
	return &Network{tb: tb, Owner: owner, Trust: trust}
}

// Member makes a member called name of the given kind: a fresh key, and
// its certificate, signed by the owner, with groups.
func (n *Network) Member(name string, kind nodecert.Kind, groups ...string) *vlink.Member {
	n.tb.Helper()
	priv := vlink.NewIdentity()
	pub, err := vlink.IdentityPublic(priv)
	if err != nil {
		n.tb.Fatal(err)
	}
	cert, err := nodecert.Sign(n.Owner, nodecert.Template{Name: name, Kind: kind, Groups: groups, PublicKey: pub})
	if err != nil {
		n.tb.Fatal(err)
	}
	return &vlink.Member{Cert: cert, Private: priv, Trust: n.Trust}
}

// Revoking returns a trust in n's owner that revokes certs.
func (n *Network) Revoking(certs ...*nodecert.Certificate) *nodecert.Trust {
	n.tb.Helper()
	var list []byte
	for _, c := range certs {
		list = append(list, c.Fingerprint()+"\n"...)
	}
	path := filepath.Join(n.tb.TempDir(), "revoked")
	if err := os.WriteFile(path, list, 0o644); err != nil {
		n.tb.Fatal(err)
	}
	t, err := nodecert.NewTrust(n.Owner.Public(), path)
	if err != nil {
		n.tb.Fatal(err)
	}
	return t
}

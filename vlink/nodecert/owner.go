package nodecert

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"os"

	"github.com/vlink-dev/vlink/internal/secret"
)

// PEM block types of the files this package reads and writes.
const (
	PEMOwnerPrivateKey = "VLINK OWNER PRIVATE KEY"
	PEMOwnerPublicKey  = "VLINK OWNER PUBLIC KEY"
	PEMCertificate     = "VLINK NODE CERTIFICATE"
)

// maxPublicFile bounds what the public files' readers read: far beyond a
// PEM certificate of MaxSize, so that a file that is not one (a device,
// a log) fails rather than eats memory.
const maxPublicFile = 64 << 10

// An OwnerKey is a network owner's private key: it signs certificates.
type OwnerKey struct {
	priv ed25519.PrivateKey
}

// NewOwner makes a new owner key.
func NewOwner() (*OwnerKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("nodecert: %w", err)
	}
	return &OwnerKey{priv: priv}, nil
}

// Public is the owner's public key: what nodes and relays trust.
func (k *OwnerKey) Public() OwnerPublicKey {
	return OwnerPublicKey(k.priv.Public().(ed25519.PublicKey))
}

// MarshalPEM encodes the key as a "VLINK OWNER PRIVATE KEY" block holding
// its 32-byte Ed25519 seed. It is the network's most precious secret.
func (k *OwnerKey) MarshalPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PEMOwnerPrivateKey, Bytes: k.priv.Seed()})
}

// ParseOwnerKeyPEM decodes what MarshalPEM encodes.
func ParseOwnerKeyPEM(data []byte) (*OwnerKey, error) {
	seed, err := decodePEM(data, PEMOwnerPrivateKey)
	if err != nil {
		return nil, err
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("nodecert: %w owner key: %d bytes, want an Ed25519 seed of %d", ErrMalformed, len(seed), ed25519.SeedSize)
	}
	return &OwnerKey{priv: ed25519.NewKeyFromSeed(seed)}, nil
}

// ReadOwnerKeyFile reads an owner key from a PEM file. As vlink's key
// files (vlink.ReadKeyFile), the file is refused if its group or others
// may read it: one rule, in package internal/secret, for both.
func ReadOwnerKeyFile(path string) (*OwnerKey, error) {
	b, err := secret.ReadFile(path, "owner key file")
	if err != nil {
		return nil, fmt.Errorf("nodecert: %w", err)
	}
	k, err := ParseOwnerKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// WriteOwnerKeyFile writes k to a new file of mode 600 at path. It never
// replaces a file (the error then matches fs.ErrExist): losing an owner
// key means signing every node's certificate again.
func WriteOwnerKeyFile(path string, k *OwnerKey) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("nodecert: %w", err)
	}
	_, err = f.Write(k.MarshalPEM())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path) // a partial key is worse than none
		return fmt.Errorf("nodecert: writing the owner key: %w", err)
	}
	return nil
}

// An OwnerPublicKey is a network owner's Ed25519 public key: the anchor
// every certificate of the network is checked against. Being an array,
// it compares with == and serves as a map key. The zero value is no key,
// and verifies nothing.
type OwnerPublicKey [OwnerKeySize]byte

// Fingerprint shows the key to people: "SHA256:" and the unpadded base64
// of the SHA-256 of its 32 bytes.
func (p OwnerPublicKey) Fingerprint() string { return fingerprint(p[:]) }

// String is the key's Fingerprint.
func (p OwnerPublicKey) String() string { return p.Fingerprint() }

// MarshalPEM encodes the key as a "VLINK OWNER PUBLIC KEY" block.
func (p OwnerPublicKey) MarshalPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PEMOwnerPublicKey, Bytes: p[:]})
}

// ParseOwnerPublicKeyPEM decodes what MarshalPEM encodes.
func ParseOwnerPublicKeyPEM(data []byte) (OwnerPublicKey, error) {
	b, err := decodePEM(data, PEMOwnerPublicKey)
	if err != nil {
		return OwnerPublicKey{}, err
	}
	if len(b) != OwnerKeySize {
		return OwnerPublicKey{}, fmt.Errorf("nodecert: %w owner public key: %d bytes, want %d", ErrMalformed, len(b), OwnerKeySize)
	}
	if OwnerPublicKey(b) == (OwnerPublicKey{}) {
		return OwnerPublicKey{}, fmt.Errorf("nodecert: %w owner public key: all zeros", ErrMalformed)
	}
	return OwnerPublicKey(b), nil
}

// ReadOwnerPublicKeyFile reads an owner's public key from a PEM file.
func ReadOwnerPublicKeyFile(path string) (OwnerPublicKey, error) {
	b, err := readPublicFile(path)
	if err != nil {
		return OwnerPublicKey{}, err
	}
	p, err := ParseOwnerPublicKeyPEM(b)
	if err != nil {
		return OwnerPublicKey{}, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// MarshalPEM encodes the certificate as a "VLINK NODE CERTIFICATE" block.
func (c *Certificate) MarshalPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: PEMCertificate, Bytes: c.raw})
}

// ParsePEM decodes what Certificate.MarshalPEM encodes, as strictly as
// Parse.
func ParsePEM(data []byte) (*Certificate, error) {
	b, err := decodePEM(data, PEMCertificate)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// ReadCertificateFile reads a certificate from a PEM file.
func ReadCertificateFile(path string) (*Certificate, error) {
	b, err := readPublicFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParsePEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// decodePEM returns the bytes of the one PEM block data holds, of type
// typ and with no headers. Unlike pem.Decode, it refuses text around the
// block (white space aside): a file is one key or one certificate.
func decodePEM(data []byte, typ string) ([]byte, error) {
	data = bytes.TrimSpace(data)
	if !bytes.HasPrefix(data, []byte("-----BEGIN ")) {
		return nil, fmt.Errorf("nodecert: %w: want a PEM block %q", ErrMalformed, typ)
	}
	b, rest := pem.Decode(data)
	switch {
	case b == nil:
		return nil, fmt.Errorf("nodecert: %w: want a PEM block %q", ErrMalformed, typ)
	case b.Type != typ:
		return nil, fmt.Errorf("nodecert: %w: a PEM block %q, want %q", ErrMalformed, b.Type, typ)
	case len(b.Headers) != 0:
		return nil, fmt.Errorf("nodecert: %w: the PEM block %q has headers", ErrMalformed, typ)
	case len(rest) != 0:
		return nil, fmt.Errorf("nodecert: %w: %d bytes after the PEM block %q", ErrMalformed, len(rest), typ)
	}
	return b.Bytes, nil
}

// readPublicFile reads a file of public data, bounded by maxPublicFile.
func readPublicFile(path string) ([]byte, error) {
	return readBounded(path, maxPublicFile)
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("nodecert: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("nodecert: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("nodecert: %s: %w: over %d bytes", path, ErrMalformed, limit)
	}
	return b, nil
}

package quic

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// pinPrefix names the hash, as OpenSSH writes its fingerprints.
const pinPrefix = "SHA256:"

// ErrPin is matched when the listener's public key is not the pinned one.
var ErrPin = errors.New("quic: the listener's key does not match the pin")

// A Pin is the SHA-256 of a certificate's public key (its
// SubjectPublicKeyInfo), written "SHA256:" and unpadded URL-safe base64
// (no "+", which separates a stack's layers).
type Pin [sha256.Size]byte

func (p Pin) String() string { return pinPrefix + base64.RawURLEncoding.EncodeToString(p[:]) }

// ParsePin reads a pin as String writes it.
func ParsePin(s string) (Pin, error) {
	var p Pin
	b64, ok := strings.CutPrefix(s, pinPrefix)
	if !ok {
		return p, fmt.Errorf("quic: pin %q: want %s followed by unpadded URL-safe base64, as the listener logs it", s, pinPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(b) != len(p) {
		return p, fmt.Errorf("quic: pin %q: want %d bytes in unpadded URL-safe base64", s, len(p))
	}
	copy(p[:], b)
	return p, nil
}

// PinOf returns the pin of a DER certificate.
func PinOf(der []byte) (Pin, error) {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return Pin{}, err
	}
	return sha256.Sum256(c.RawSubjectPublicKeyInfo), nil
}

// newCertificate makes a self-signed Ed25519 certificate. Nothing checks
// its names or dates (the dialer pins the key, or the hello's key covers
// the channel); they are set so that tools reading it see something
// sensible.
func newCertificate() (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "vlink quic listener"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(20, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}, nil
}

// loadCertificate reads the certificate and key kept in path, making
// them (mode 600) if the file does not exist, so that a listener's pin
// survives restarts.
func loadCertificate(path string) (tls.Certificate, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return createCertificate(path)
	}
	if err != nil {
		return tls.Certificate{}, err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return tls.Certificate{}, fmt.Errorf("quic: %s holds a private key and is readable by others (mode %v); chmod 600 it", path, fi.Mode().Perm())
	}
	c, err := tls.X509KeyPair(b, b)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("quic: %s: %w", path, err)
	}
	return c, nil
}

func createCertificate(path string) (tls.Certificate, error) {
	c, err := newCertificate()
	if err != nil {
		return c, err
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey.(crypto.Signer))
	if err != nil {
		return c, err
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	b = append(b, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
	// Written aside and linked into place: two listeners starting at
	// once keep one key, and neither reads a half-written file.
	f, err := os.CreateTemp(filepath.Dir(path), ".vlink-quic-cert-*") // mode 600
	if err != nil {
		return c, err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return c, err
	}
	if err := os.Link(f.Name(), path); errors.Is(err, os.ErrExist) {
		return loadCertificate(path)
	} else if err != nil {
		return c, err
	}
	return c, nil
}

// verifyPin returns the check a dialer's TLS config runs on the
// listener's certificate: its key must be the pinned one.
func verifyPin(pin Pin) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return ErrPin
		}
		got := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
		if subtle.ConstantTimeCompare(got[:], pin[:]) != 1 {
			return fmt.Errorf("%w: it has %s, the pin is %s", ErrPin, Pin(got), pin)
		}
		return nil
	}
}

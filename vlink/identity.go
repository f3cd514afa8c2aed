package vlink

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// NewIdentity returns a fresh static key for a listener (Policy.Identity):
// an X25519 private key of identitySize bytes.
func NewIdentity() []byte {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return k.Bytes()
}

// IdentityPublic returns the public half of a listener's static key: what
// its accepts announce, and what dialers pin.
func IdentityPublic(identity []byte) ([]byte, error) {
	k, err := ecdh.X25519().NewPrivateKey(identity)
	if err != nil {
		return nil, fmt.Errorf("identity is %d bytes, want an X25519 private key of %d", len(identity), identitySize)
	}
	return k.PublicKey().Bytes(), nil
}

// ReadIdentityFile reads a listener's static key (Policy.Identity) from a
// file of mode 600 holding it in base64, as vlink key --identity writes
// it.
func ReadIdentityFile(path string) ([]byte, error) {
	b, err := readSecretFile(path, "identity file")
	if err != nil {
		return nil, err
	}
	id, err := base64.StdEncoding.Strict().DecodeString(string(b))
	if err == nil {
		_, err = IdentityPublic(id)
	}
	if err != nil {
		return nil, fmt.Errorf("identity file %s does not hold a base64 X25519 key of %d bytes (make one with vlink key --identity)", path, identitySize)
	}
	return id, nil
}

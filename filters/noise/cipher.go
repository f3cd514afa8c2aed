package noise

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"

	flynn "github.com/flynn/noise"
	"golang.org/x/crypto/chacha20poly1305"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// cipherState is Noise's CipherState (Noise spec §5.1) for ChaChaPoly
// (§12.3) or AESGCM (§12.4): the key the handshake gave and a counter n,
// ENCRYPT(k, n, ad, p) with the nonce 32 zero bits followed by n,
// little-endian for ChaChaPoly and big-endian for AESGCM. It is taken
// over from flynn/noise's CipherState after the handshake only because
// that one allocates a nonce per message; the construction is the same,
// and a test checks both give the same bytes.
type cipherState struct {
	aead      cipher.AEAD
	bigEndian bool
	n         uint64
	nonce     [chacha20poly1305.NonceSize]byte
}

// errNonce is returned after 2^64-1 records, where Noise's nonces end.
var errNonce = errors.New("noise: nonces exhausted; reconnect")

func newCipherState(cs *flynn.CipherState, a layer.AEAD) (*cipherState, error) {
	k := cs.UnsafeKey()
	if a == layer.AEADAESGCM {
		block, err := aes.NewCipher(k[:])
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		return &cipherState{aead: aead, bigEndian: true, n: cs.Nonce()}, nil
	}
	aead, err := chacha20poly1305.New(k[:])
	if err != nil {
		return nil, err
	}
	return &cipherState{aead: aead, n: cs.Nonce()}, nil
}

func (s *cipherState) next() ([]byte, error) {
	if s.n > flynn.MaxNonce {
		return nil, errNonce
	}
	if s.bigEndian {
		binary.BigEndian.PutUint64(s.nonce[4:], s.n)
	} else {
		binary.LittleEndian.PutUint64(s.nonce[4:], s.n)
	}
	s.n++
	return s.nonce[:], nil
}

// seal appends the ciphertext of p, authenticated with ad, to out.
func (s *cipherState) seal(out, ad, p []byte) ([]byte, error) {
	nonce, err := s.next()
	if err != nil {
		return nil, err
	}
	return s.aead.Seal(out, nonce, p, ad), nil
}

// open appends the plaintext of ct to out. A ciphertext that does not
// authenticate leaves the counter as it was.
func (s *cipherState) open(out, ad, ct []byte) ([]byte, error) {
	nonce, err := s.next()
	if err != nil {
		return nil, err
	}
	p, err := s.aead.Open(out, nonce, ct, ad)
	if err != nil {
		s.n--
	}
	return p, err
}

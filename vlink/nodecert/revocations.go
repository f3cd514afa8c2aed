package nodecert

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxRevocationsFile bounds a revocation list: some 300,000 lines, far
// beyond any network's, so that a file that is not one fails rather than
// eats memory.
const maxRevocationsFile = 16 << 20

// fingerprintLen is the length of a fingerprint as written.
var fingerprintLen = len(fingerprintPrefix) + base64.RawStdEncoding.EncodedLen(sha256.Size)

// Revocations is a revocation list: the fingerprints of certificates
// refused although their signature holds. It is immutable, so safe for
// concurrent use; a nil *Revocations revokes nothing.
type Revocations struct {
	set map[[sha256.Size]byte]struct{}
}

// A SyntaxError is a line of a revocation list that ParseRevocations
// refuses; it matches ErrMalformed.
type SyntaxError struct {
	Line int // 1-based
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("nodecert: revocation list line %d: %s", e.Line, e.Msg)
}

func (e *SyntaxError) Is(target error) bool { return target == ErrMalformed }

// ParseRevocations reads a revocation list: one certificate fingerprint a
// line, as Certificate.Fingerprint writes it ("SHA256:" and 43 characters
// of unpadded base64), optionally followed by white space and a #
// comment; blank lines and lines of a # comment are skipped. A
// fingerprint listed twice is listed once. Any other line is a
// *SyntaxError: a list that half-parses would silently let a revoked
// certificate back in.
//
//	# laptop stolen on 2025-03-02
//	SHA256:6Gp2ZcXhRQ0v0H2c8mFqfJ3y6bDkzC1u8Q2j3pT1a0M  # alice
func ParseRevocations(data []byte) (*Revocations, error) {
	r := &Revocations{set: make(map[[sha256.Size]byte]struct{})}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxRevocationsFile)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) > 1:
			return nil, &SyntaxError{Line: n, Msg: fmt.Sprintf("%d fields, want one fingerprint (a comment starts with #)", len(fields))}
		}
		sum, ok := parseFingerprint(fields[0])
		if !ok {
			return nil, &SyntaxError{Line: n, Msg: fmt.Sprintf("%q is not a certificate fingerprint (SHA256: and %d characters of unpadded base64)", clip(fields[0]), fingerprintLen-len(fingerprintPrefix))}
		}
		r.set[sum] = struct{}{}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nodecert: %w revocation list: %v", ErrMalformed, err)
	}
	return r, nil
}

// clip keeps an error about a long bad line short.
func clip(s string) string {
	const maxShown = 64
	if len(s) > maxShown {
		return s[:maxShown] + "..."
	}
	return s
}

func parseFingerprint(s string) (sum [sha256.Size]byte, ok bool) {
	b64, found := strings.CutPrefix(s, fingerprintPrefix)
	if !found || len(s) != fingerprintLen {
		return sum, false
	}
	// Strict: the unused low bits of the last character must be zero, so
	// that one fingerprint has one spelling.
	n, err := base64.RawStdEncoding.Strict().Decode(sum[:], []byte(b64))
	return sum, err == nil && n == sha256.Size
}

// ReadRevocationsFile reads a revocation list from a file.
func ReadRevocationsFile(path string) (*Revocations, error) {
	b, err := readBounded(path, maxRevocationsFile)
	if err != nil {
		return nil, err
	}
	r, err := ParseRevocations(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Revoked reports whether c is on the list.
func (r *Revocations) Revoked(c *Certificate) bool {
	if r == nil {
		return false
	}
	_, revoked := r.set[c.sum]
	return revoked
}

// Len is how many certificates the list revokes.
func (r *Revocations) Len() int {
	if r == nil {
		return 0
	}
	return len(r.set)
}

// Fingerprints are the revoked certificates' fingerprints, sorted: a list
// ParseRevocations reads back, one a line.
func (r *Revocations) Fingerprints() []string {
	if r == nil {
		return nil
	}
	fps := make([]string, 0, len(r.set))
	for sum := range r.set {
		fps = append(fps, fingerprintPrefix+base64.RawStdEncoding.EncodeToString(sum[:]))
	}
	slices.Sort(fps)
	return fps
}

// A Trust decides whether a certificate is accepted: issued by the
// network's owner, valid now, and not revoked. Relays and nodes hold one.
// Its methods are safe for concurrent use.
type Trust struct {
	owner OwnerPublicKey
	path  string // the revocation list's file; "" for none

	reload  sync.Mutex // one Reload at a time, so an older read never lands last
	revoked atomic.Pointer[Revocations]

	// verified holds the fingerprints of certificates whose signature
	// the owner's key verified: a fingerprint names exactly one
	// encoding, signature included, so it need not be verified again
	// (an Ed25519 verification per connection was a tenth of a
	// member's handshake). Bounded: emptied when full.
	mu       sync.Mutex
	verified map[[sha256.Size]byte]struct{}
}

// maxVerified bounds Trust.verified.
const maxVerified = 4096

// NewTrust returns the Trust of the network whose owner's key is owner,
// with the revocation list read from the file revocations ("" for none).
// A list named but missing is an error: a relay that came up without its
// list would accept what the owner revoked.
func NewTrust(owner OwnerPublicKey, revocations string) (*Trust, error) {
	if owner == (OwnerPublicKey{}) {
		return nil, fmt.Errorf("nodecert: no owner key to trust")
	}
	t := &Trust{owner: owner, path: revocations}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Owner is the owner's key the Trust checks certificates against.
func (t *Trust) Owner() OwnerPublicKey { return t.owner }

// Revocations is the revocation list in force.
func (t *Trust) Revocations() *Revocations { return t.revoked.Load() }

// Reload reads the revocation list's file again; the caller decides when
// (on SIGHUP, say). On an error the list in force stays: a list being
// edited must not open the network.
func (t *Trust) Reload() error {
	if t.path == "" {
		return nil
	}
	t.reload.Lock()
	defer t.reload.Unlock()
	r, err := ReadRevocationsFile(t.path)
	if err != nil {
		return err
	}
	t.revoked.Store(r)
	return nil
}

// Check accepts c if the owner issued it, it is valid at now, and it is
// not revoked; otherwise the error is a *CertificateError matching
// ErrWrongIssuer, ErrBadSignature, ErrExpired, ErrNotYetValid or
// ErrRevoked.
func (t *Trust) Check(c *Certificate, now time.Time) error {
	t.mu.Lock()
	_, known := t.verified[c.sum]
	t.mu.Unlock()
	if known && c.issuer == t.owner {
		if err := c.checkTime(now); err != nil {
			return err
		}
	} else {
		if err := c.Verify(t.owner, now); err != nil {
			return err
		}
		t.mu.Lock()
		if t.verified == nil || len(t.verified) >= maxVerified {
			t.verified = make(map[[sha256.Size]byte]struct{})
		}
		t.verified[c.sum] = struct{}{}
		t.mu.Unlock()
	}
	if t.revoked.Load().Revoked(c) {
		return &CertificateError{Cert: c, Err: ErrRevoked}
	}
	return nil
}

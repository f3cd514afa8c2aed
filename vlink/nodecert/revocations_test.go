package nodecert

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseRevocations(t *testing.T) {
	fp := sign(t, newOwner(t), template(t)).Fingerprint()
	example := "SHA256:6Gp2ZcXhRQ0v0H2c8mFqfJ3y6bDkzC1u8Q2j3pT1a0M" // from the doc comment
	for _, tc := range []struct {
		name, data string
		want       []string // nil: an error
		line       int      // of the error
	}{
		{"empty", "", []string{}, 0},
		{"comments and blanks", "# revoked\n\n   \n\t# more\n", []string{}, 0},
		{"one", fp + "\n", []string{fp}, 0},
		{"no final newline", fp, []string{fp}, 0},
		{"crlf", "# x\r\n" + fp + "\r\n", []string{fp}, 0},
		{"indented, trailing comment", "  " + fp + "\t# alice's laptop\n", []string{fp}, 0},
		{"comment without space", fp + "#x\n", []string{fp}, 0},
		{"twice", fp + "\n" + fp + "\n", []string{fp}, 0},
		{"the doc's example", "# laptop stolen on 2025-03-02\n" + example + "  # alice\n", []string{example}, 0},
		{"two fields", "# x\n" + fp + " " + fp + "\n", nil, 2},
		{"no prefix", "\n\n" + strings.TrimPrefix(fp, "SHA256:") + "\n", nil, 3},
		{"lower-case prefix", "sha256:" + strings.TrimPrefix(fp, "SHA256:"), nil, 1},
		{"padded", fp + "=", nil, 1},
		{"short", fp[:len(fp)-1], nil, 1},
		{"long", fp + "A", nil, 1},
		{"not canonical", example[:len(example)-1] + "N", nil, 1},
		{"bad base64", fp[:len(fp)-1] + "!", nil, 1},
		{"other hash", "MD5:" + fp[7:], nil, 1},
		{"a certificate", "-----BEGIN VLINK NODE CERTIFICATE-----", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRevocations([]byte(tc.data))
			if tc.want == nil {
				var se *SyntaxError
				if !errors.As(err, &se) || se.Line != tc.line || !errors.Is(err, ErrMalformed) {
					t.Fatalf("ParseRevocations = %v, want a *SyntaxError on line %d", err, tc.line)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Fingerprints(); !slices.Equal(got, tc.want) || r.Len() != len(tc.want) {
				t.Fatalf("Fingerprints = %q, want %q", got, tc.want)
			}
		})
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTrust(t *testing.T) {
	owner, other := newOwner(t), newOwner(t)
	alice := sign(t, owner, template(t))
	bob := sign(t, owner, Template{Name: "bob", PublicKey: nodeKey(t), NotAfter: end})
	stranger := sign(t, other, template(t))
	// alice's certificate with one bit of its signature flipped, checked
	// after alice's own: what the Trust remembers verifying is exactly
	// one encoding.
	raw := alice.Marshal()
	raw[len(raw)-1] ^= 1
	forged, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(t.TempDir(), "revoked")
	writeFile(t, list, "# stolen\n"+bob.Fingerprint()+"\n")
	trust, err := NewTrust(owner.Public(), list)
	if err != nil {
		t.Fatal(err)
	}
	if trust.Owner() != owner.Public() || trust.Revocations().Len() != 1 {
		t.Fatalf("Trust of %v with %d revocations", trust.Owner(), trust.Revocations().Len())
	}
	for _, tc := range []struct {
		name string
		c    *Certificate
		now  time.Time
		want error
	}{
		{"valid", alice, t0, nil},
		{"revoked", bob, t0, ErrRevoked},
		{"expired", alice, end, ErrExpired},
		{"not yet valid", alice, start.Add(-time.Second), ErrNotYetValid},
		{"another owner's", stranger, t0, ErrWrongIssuer},
		{"forged after the valid one", forged, t0, ErrBadSignature},
		{"valid again", alice, t0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := trust.Check(tc.c, tc.now)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
			var ce *CertificateError
			if err != nil && (!errors.As(err, &ce) || ce.Cert != tc.c) {
				t.Fatalf("Check = %#v, want a *CertificateError", err)
			}
		})
	}

	// Reload takes a new list, and keeps the old one when the new one is
	// broken or gone.
	writeFile(t, list, alice.Fingerprint()+"\n")
	if err := trust.Reload(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(trust.Check(alice, t0), ErrRevoked) || trust.Check(bob, t0) != nil {
		t.Fatal("Reload did not take the new list")
	}
	writeFile(t, list, alice.Fingerprint()+"\nnot a fingerprint\n")
	var se *SyntaxError
	if err := trust.Reload(); !errors.As(err, &se) || se.Line != 2 || !strings.Contains(err.Error(), list) {
		t.Fatalf("Reload of a broken list = %v, want a *SyntaxError on line 2 naming the file", err)
	}
	if !errors.Is(trust.Check(alice, t0), ErrRevoked) {
		t.Fatal("a broken list replaced the one in force")
	}
	os.Remove(list)
	if err := trust.Reload(); err == nil {
		t.Fatal("Reload of a missing list succeeded")
	}
	if !errors.Is(trust.Check(alice, t0), ErrRevoked) {
		t.Fatal("a missing list replaced the one in force")
	}

	if _, err := NewTrust(owner.Public(), list); err == nil {
		t.Error("NewTrust with a missing list succeeded")
	}
	if _, err := NewTrust(OwnerPublicKey{}, ""); err == nil {
		t.Error("NewTrust with no owner succeeded")
	}
	none, err := NewTrust(owner.Public(), "")
	if err != nil || none.Check(bob, t0) != nil || none.Reload() != nil || none.Revocations().Revoked(bob) {
		t.Errorf("a Trust without a list: %v", err)
	}
}

// TestTrustConcurrent runs checks while the list is reloaded (with -race).
func TestTrustConcurrent(t *testing.T) {
	owner := newOwner(t)
	alice := sign(t, owner, template(t))
	list := filepath.Join(t.TempDir(), "revoked")
	writeFile(t, list, "")
	trust, err := NewTrust(owner.Public(), list)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				if err := trust.Check(alice, t0); err != nil && !errors.Is(err, ErrRevoked) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			data := ""
			if i%2 == 0 {
				data = alice.Fingerprint()
			}
			writeFile(t, list+".new", data)
			if err := os.Rename(list+".new", list); err != nil {
				t.Error(err)
				return
			}
			if err := trust.Reload(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
}

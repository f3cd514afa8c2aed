package nodecert

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/internal/secret"
)

// TestFiles round-trips an owner's keys and a certificate through their
// PEM files, and checks that the certificate read back still verifies.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	owner := newOwner(t)
	keyFile := filepath.Join(dir, "owner.key")
	if err := WriteOwnerKeyFile(keyFile, owner); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("owner key file: %v, %v", fi.Mode(), err)
	}
	if err := WriteOwnerKeyFile(keyFile, newOwner(t)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("writing over an owner key: %v, want fs.ErrExist", err)
	}
	back, err := ReadOwnerKeyFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if back.Public() != owner.Public() {
		t.Fatal("owner key changed through its file")
	}

	pubFile := filepath.Join(dir, "owner.pub")
	if err := os.WriteFile(pubFile, owner.Public().MarshalPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	pub, err := ReadOwnerPublicKeyFile(pubFile)
	if err != nil || pub != owner.Public() {
		t.Fatalf("ReadOwnerPublicKeyFile = %v, %v", pub, err)
	}

	c := sign(t, back, template(t))
	certFile := filepath.Join(dir, "alice.crt")
	if err := os.WriteFile(certFile, c.MarshalPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	c2, err := ReadCertificateFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c2.Marshal(), c.Marshal()) {
		t.Fatal("certificate changed through its file")
	}
	if err := c2.Verify(pub, t0); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(c.MarshalPEM()), "-----BEGIN "+PEMCertificate+"-----\n") {
		t.Errorf("PEM:\n%s", c.MarshalPEM())
	}
}

// TestOwnerKeyFileMode: an owner key others may read is refused, by the
// rule vlink's key files follow.
func TestOwnerKeyFileMode(t *testing.T) {
	dir := t.TempDir()
	pemKey := newOwner(t).MarshalPEM()
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o640, false},
		{0o604, false},
		{0o644, false},
		{0o660, false},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			p := filepath.Join(dir, tc.mode.String())
			if err := os.WriteFile(p, pemKey, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, err := ReadOwnerKeyFile(p)
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !errors.Is(err, secret.ErrReadableByOthers) {
				t.Fatalf("ReadOwnerKeyFile = %v, want ErrReadableByOthers", err)
			}
		})
	}
	if _, err := ReadOwnerKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestPEMStrict(t *testing.T) {
	owner := newOwner(t)
	c := sign(t, owner, template(t))
	cert := string(c.MarshalPEM())
	for _, tc := range []struct {
		name, data string
		ok         bool
	}{
		{"as written", cert, true},
		{"surrounding space", "\n  " + cert + "\n\n", true},
		{"empty", "", false},
		{"text before", "alice\n" + cert, false},
		{"text after", cert + "alice\n", false},
		{"two blocks", cert + cert, false},
		{"other type", string(owner.Public().MarshalPEM()), false},
		{"headers", strings.Replace(cert, "-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1), false},
		{"bad base64", strings.Replace(cert, "\n", "\n!", 2), false},
		{"unterminated", strings.SplitAfter(cert, "\n")[0] + strings.SplitAfter(cert, "\n")[1], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePEM([]byte(tc.data))
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParsePEM = %v, want ErrMalformed", err)
			}
		})
	}
	for name, f := range map[string]func([]byte) error{
		"owner key":        func(b []byte) error { _, err := ParseOwnerKeyPEM(b); return err },
		"owner public key": func(b []byte) error { _, err := ParseOwnerPublicKeyPEM(b); return err },
	} {
		for _, b := range [][]byte{
			[]byte(cert),
			[]byte("-----BEGIN " + PEMOwnerPrivateKey + "-----\nAAAA\n-----END " + PEMOwnerPrivateKey + "-----\n"),
			[]byte("-----BEGIN " + PEMOwnerPublicKey + "-----\nAAAA\n-----END " + PEMOwnerPublicKey + "-----\n"),
			OwnerPublicKey{}.MarshalPEM(),
		} {
			if err := f(b); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s of %q: %v, want ErrMalformed", name, b, err)
			}
		}
	}
}

func TestReadPublicFileBound(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(p, make([]byte, maxPublicFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCertificateFile(p); !errors.Is(err, ErrMalformed) {
		t.Errorf("ReadCertificateFile of a huge file = %v", err)
	}
}

package nodecert

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, never
// accept more than MaxSize bytes, and what it accepts must encode back,
// field by field, to exactly the bytes read (the form is canonical).
func FuzzParse(f *testing.F) {
	owner := newOwner(f)
	key := nodeKey(f)
	for _, tmpl := range []Template{
		{Name: "alice", Groups: []string{"ops", "admins"}, PublicKey: key, NotBefore: start, NotAfter: end},
		{Name: "relay-1", Kind: KindRelay, PublicKey: key},
		{Name: strings.Repeat("n", MaxNameLen), Groups: []string{"a", "b-2", strings.Repeat("g", MaxGroupLen)}, PublicKey: key, NotAfter: end},
	} {
		f.Add(sign(f, owner, tmpl).Marshal())
	}
	f.Add(raw{version: Version, nb: 1, na: 2, name: "a", nameLen: -1, groupCount: -1}.encode())
	f.Add([]byte{Version})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Parse(in)
		if err != nil {
			return
		}
		if len(in) > MaxSize {
			t.Fatalf("accepted %d bytes", len(in))
		}
		again := reencode(t, c)
		if !bytes.Equal(again, in) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, in)
		}
		_ = c.String()
		_ = c.Verify(owner.Public(), t0) // must not panic
	})
}

// reencode builds a parsed certificate's encoding from its fields, not
// from the bytes kept.
func reencode(t *testing.T, c *Certificate) []byte {
	nb, err := toUnix(c.NotBefore(), "not-before")
	if err != nil {
		t.Fatal(err)
	}
	na, err := toUnix(c.NotAfter(), "not-after")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := Template{Name: c.Name(), Groups: c.Groups(), Kind: c.Kind(), PublicKey: c.PublicKey()}
	b := appendBody(nil, &tmpl, nb, na, c.Issuer())
	return append(b, c.raw[len(c.raw)-SignatureSize:]...)
}

// FuzzParseRevocations feeds arbitrary text to ParseRevocations: it must
// never panic, and a list it accepts, written back one fingerprint a
// line, must read back to the same list.
func FuzzParseRevocations(f *testing.F) {
	c := sign(f, newOwner(f), template(f))
	f.Add([]byte(""))
	f.Add([]byte("# revoked\n" + c.Fingerprint() + "  # alice\n\n"))
	f.Add([]byte(c.Fingerprint() + "\r\n" + c.Fingerprint()))
	f.Add([]byte("SHA256:6Gp2ZcXhRQ0v0H2c8mFqfJ3y6bDkzC1u8Q2j3pT1a0N\n"))
	f.Add([]byte("SHA256:x y\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ParseRevocations(in)
		if err != nil {
			return
		}
		fps := r.Fingerprints()
		back, err := ParseRevocations([]byte(strings.Join(fps, "\n")))
		if err != nil {
			t.Fatalf("the list written back does not parse: %v", err)
		}
		if !slices.Equal(back.Fingerprints(), fps) {
			t.Fatalf("the list written back differs:\n got %q\nwant %q", back.Fingerprints(), fps)
		}
		for _, fp := range fps {
			if !strings.Contains(string(in), fp) {
				t.Fatalf("%s revoked, but not in the input", fp)
			}
		}
	})
}

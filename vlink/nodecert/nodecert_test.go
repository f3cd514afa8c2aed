package nodecert

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink/knownnodes"
)

var (
	t0    = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	year  = 365 * 24 * time.Hour
	start = t0.Add(-time.Hour)
	end   = t0.Add(year)
)

func newOwner(t testing.TB) *OwnerKey {
	t.Helper()
	k, err := NewOwner()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeKey is a node's X25519 public key, as vlink.IdentityPublic makes.
func nodeKey(t testing.TB) []byte {
	t.Helper()
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey().Bytes()
}

func template(t testing.TB) Template {
	return Template{
		Name:      "alice",
		Groups:    []string{"ops", "admins"},
		PublicKey: nodeKey(t),
		NotBefore: start,
		NotAfter:  end,
	}
}

func sign(t testing.TB, owner *OwnerKey, tmpl Template) *Certificate {
	t.Helper()
	c, err := Sign(owner, tmpl)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSign(t *testing.T) {
	owner := newOwner(t)
	key := nodeKey(t)
	many := make([]string, MaxGroups+1)
	for i := range many {
		many[i] = "g" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	for _, tc := range []struct {
		name string
		edit func(*Template)
		ok   bool
	}{
		{"node", func(*Template) {}, true},
		{"relay", func(tp *Template) { tp.Kind = KindRelay }, true},
		{"no groups", func(tp *Template) { tp.Groups = nil }, true},
		{"max groups", func(tp *Template) { tp.Groups = many[:MaxGroups] }, true},
		{"longest name", func(tp *Template) { tp.Name = strings.Repeat("n", MaxNameLen) }, true},
		{"no bounds", func(tp *Template) { tp.NotBefore, tp.NotAfter = time.Time{}, time.Time{} }, true},
		{"no expiry", func(tp *Template) { tp.NotAfter = time.Time{} }, true},
		{"no start", func(tp *Template) { tp.NotBefore = time.Time{} }, true},
		{"bad name", func(tp *Template) { tp.Name = "Alice" }, false},
		{"empty name", func(tp *Template) { tp.Name = "" }, false},
		{"long name", func(tp *Template) { tp.Name = strings.Repeat("n", MaxNameLen+1) }, false},
		{"bad group", func(tp *Template) { tp.Groups = []string{"ops", "a b"} }, false},
		{"empty group", func(tp *Template) { tp.Groups = []string{""} }, false},
		{"duplicate group", func(tp *Template) { tp.Groups = []string{"ops", "dev", "ops"} }, false},
		{"too many groups", func(tp *Template) { tp.Groups = many }, false},
		{"unknown kind", func(tp *Template) { tp.Kind = 2 }, false},
		{"short key", func(tp *Template) { tp.PublicKey = key[:31] }, false},
		{"no key", func(tp *Template) { tp.PublicKey = nil }, false},
		{"zero key", func(tp *Template) { tp.PublicKey = make([]byte, KeySize) }, false},
		{"reversed bounds", func(tp *Template) { tp.NotBefore, tp.NotAfter = end, start }, false},
		{"empty validity", func(tp *Template) { tp.NotAfter = tp.NotBefore }, false},
		{"before 1970", func(tp *Template) { tp.NotBefore = time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC) }, false},
		{"after 9999", func(tp *Template) { tp.NotAfter = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := Template{Name: "alice", Groups: []string{"ops", "admins"}, PublicKey: key, NotBefore: start, NotAfter: end}
			tc.edit(&tmpl)
			given := slices.Clone(tmpl.Groups)
			c, err := Sign(owner, tmpl)
			if !tc.ok {
				if !errors.Is(err, ErrInvalidTemplate) {
					t.Fatalf("Sign = %v, want an error matching ErrInvalidTemplate", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(tmpl.Groups, given) {
				t.Errorf("Sign changed the template's groups to %q", tmpl.Groups)
			}
			want := slices.Sorted(slices.Values(given))
			if c.Name() != tmpl.Name || c.Kind() != tmpl.Kind || !bytes.Equal(c.PublicKey(), tmpl.PublicKey) ||
				!slices.Equal(c.Groups(), want) || !c.NotBefore().Equal(tmpl.NotBefore) || !c.NotAfter().Equal(tmpl.NotAfter) ||
				c.Issuer() != owner.Public() {
				t.Errorf("certificate does not hold its template:\n%v", c)
			}
			if err := c.Verify(owner.Public(), t0); err != nil {
				t.Errorf("Verify = %v", err)
			}
			if len(c.Marshal()) > MaxSize {
				t.Errorf("%d bytes, over MaxSize %d", len(c.Marshal()), MaxSize)
			}
		})
	}
	if _, err := Sign(nil, template(t)); !errors.Is(err, ErrInvalidTemplate) {
		t.Errorf("Sign(nil) = %v", err)
	}
}

// TestSignTruncates: a bound is kept in whole seconds, and the returned
// certificate says so.
func TestSignTruncates(t *testing.T) {
	tmpl := template(t)
	tmpl.NotAfter = end.Add(999 * time.Millisecond)
	c := sign(t, newOwner(t), tmpl)
	if !c.NotAfter().Equal(end) {
		t.Errorf("NotAfter = %v, want %v", c.NotAfter(), end)
	}
}

func TestVerify(t *testing.T) {
	owner, other := newOwner(t), newOwner(t)
	c := sign(t, owner, template(t))
	open := sign(t, owner, Template{Name: "bob", PublicKey: nodeKey(t)})
	enc := c.Marshal()
	enc[len(enc)-1] ^= 1
	forged, err := Parse(enc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		c     *Certificate
		owner OwnerPublicKey
		now   time.Time
		want  error
	}{
		{"valid", c, owner.Public(), t0, nil},
		{"at not-before", c, owner.Public(), start, nil},
		{"a second before not-after", c, owner.Public(), end.Add(-time.Second), nil},
		{"not yet valid", c, owner.Public(), start.Add(-time.Nanosecond), ErrNotYetValid},
		{"at not-after", c, owner.Public(), end, ErrExpired},
		{"expired", c, owner.Public(), end.Add(year), ErrExpired},
		{"unbounded, long ago", open, owner.Public(), time.Unix(0, 0), nil},
		{"unbounded, far ahead", open, owner.Public(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), nil},
		{"wrong owner", c, other.Public(), t0, ErrWrongIssuer},
		{"zero owner", c, OwnerPublicKey{}, t0, ErrWrongIssuer},
		{"bad signature", forged, owner.Public(), t0, ErrBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Verify(tc.owner, tc.now)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			if err == nil {
				return
			}
			var ce *CertificateError
			if !errors.As(err, &ce) || ce.Cert != tc.c {
				t.Fatalf("Verify = %#v, want a *CertificateError of the certificate", err)
			}
			if !strings.Contains(err.Error(), tc.c.Fingerprint()) || !strings.Contains(err.Error(), tc.c.Name()) {
				t.Errorf("the error %q does not name the certificate", err)
			}
		})
	}
	if err := (&Certificate{}).Verify(owner.Public(), t0); !errors.Is(err, ErrMalformed) {
		t.Errorf("zero Certificate: Verify = %v", err)
	}
}

// TestEveryByteMatters flips each bit of each byte of an encoded
// certificate: Parse or Verify must refuse every change, so nothing a
// certificate says can be altered without the owner's key.
func TestEveryByteMatters(t *testing.T) {
	owner := newOwner(t)
	tmpl := template(t)
	tmpl.Kind = KindRelay
	enc := sign(t, owner, tmpl).Marshal()
	for i := range enc {
		for bit := range 8 {
			b := slices.Clone(enc)
			b[i] ^= 1 << bit
			c, err := Parse(b)
			if err == nil {
				err = c.Verify(owner.Public(), t0)
			}
			if err == nil {
				t.Errorf("byte %d bit %d flipped: accepted", i, bit)
			}
		}
	}
	for _, b := range [][]byte{enc[:len(enc)-1], append(slices.Clone(enc), 0), nil} {
		if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse of %d bytes = %v", len(b), err)
		}
	}
}

// raw builds encodings by hand, valid or not, for Parse's strictness.
type raw struct {
	version, kind byte
	nb, na        uint64
	name          string
	nameLen       int // -1: len(name)
	groups        []string
	groupCount    int // -1: len(groups)
	trailer       []byte
}

func (r raw) encode() []byte {
	b := []byte{r.version, r.kind}
	b = binary.BigEndian.AppendUint64(b, r.nb)
	b = binary.BigEndian.AppendUint64(b, r.na)
	b = append(b, bytes.Repeat([]byte{7}, KeySize+OwnerKeySize)...)
	n := r.nameLen
	if n < 0 {
		n = len(r.name)
	}
	b = append(append(b, byte(n)), r.name...)
	n = r.groupCount
	if n < 0 {
		n = len(r.groups)
	}
	b = append(b, byte(n))
	for _, g := range r.groups {
		b = append(append(b, byte(len(g))), g...)
	}
	b = append(b, r.trailer...)
	return append(b, make([]byte, SignatureSize)...)
}

func TestParseStrict(t *testing.T) {
	good := raw{version: Version, nb: 1, na: 2, name: "a", nameLen: -1, groups: []string{"a", "b"}, groupCount: -1}
	many := make([]string, MaxGroups+1)
	for i := range many {
		many[i] = "g" + strings.Repeat("a", i+1)
	}
	slices.Sort(many)
	for _, tc := range []struct {
		name string
		edit func(*raw)
		ok   bool
	}{
		{"good", func(*raw) {}, true},
		{"open bounds", func(r *raw) { r.nb, r.na = 0, 0 }, true},
		{"latest bound", func(r *raw) { r.na = maxUnix }, true},
		{"max groups", func(r *raw) { r.groups = many[:MaxGroups] }, true},
		{"version 0", func(r *raw) { r.version = 0 }, false},
		{"version 2", func(r *raw) { r.version = 2 }, false},
		{"unknown kind", func(r *raw) { r.kind = 2 }, false},
		{"reversed bounds", func(r *raw) { r.nb, r.na = 2, 1 }, false},
		{"equal bounds", func(r *raw) { r.nb, r.na = 2, 2 }, false},
		{"bound past 9999", func(r *raw) { r.na = maxUnix + 1 }, false},
		{"huge bound", func(r *raw) { r.nb, r.na = 1, 1<<63 }, false},
		{"empty name", func(r *raw) { r.name = "" }, false},
		{"bad name", func(r *raw) { r.name = "A" }, false},
		{"long name", func(r *raw) { r.name = strings.Repeat("a", MaxNameLen+1) }, false},
		{"name length past the end", func(r *raw) { r.nameLen = 255 }, false},
		{"unsorted groups", func(r *raw) { r.groups = []string{"b", "a"} }, false},
		{"duplicate groups", func(r *raw) { r.groups = []string{"a", "a"} }, false},
		{"bad group", func(r *raw) { r.groups = []string{"a-"} }, false},
		{"too many groups", func(r *raw) { r.groups = many }, false},
		{"group count over", func(r *raw) { r.groupCount = 3 }, false},
		{"group count under", func(r *raw) { r.groupCount = 1 }, false},
		{"trailing bytes", func(r *raw) { r.trailer = []byte{0} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good
			tc.edit(&r)
			_, err := Parse(r.encode())
			if tc.ok && err != nil {
				t.Fatalf("Parse = %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse = %v, want an error matching ErrMalformed", err)
			}
		})
	}
}

func TestCertificateImmutable(t *testing.T) {
	c := sign(t, newOwner(t), template(t))
	before := c.Marshal()
	c.Groups()[0] = "x"
	c.PublicKey()[0] ^= 1
	c.Marshal()[0] ^= 1
	if !bytes.Equal(c.Marshal(), before) || c.Groups()[0] != "admins" {
		t.Fatal("a slice a method returned changed the certificate")
	}
}

func TestInGroup(t *testing.T) {
	c := sign(t, newOwner(t), template(t))
	for g, want := range map[string]bool{"ops": true, "admins": true, "dev": false, "": false} {
		if c.InGroup(g) != want {
			t.Errorf("InGroup(%q) = %v", g, !want)
		}
	}
}

func TestFingerprints(t *testing.T) {
	owner := newOwner(t)
	c := sign(t, owner, template(t))
	pub := owner.Public()
	if got, want := pub.Fingerprint(), knownnodes.Fingerprint(pub[:]); got != want {
		t.Errorf("owner fingerprint %s, knownnodes shows %s", got, want)
	}
	if got, want := c.Fingerprint(), knownnodes.Fingerprint(c.Marshal()); got != want {
		t.Errorf("certificate fingerprint %s, want %s", got, want)
	}
	if pub.String() != pub.Fingerprint() {
		t.Errorf("String %s", pub.String())
	}
	again := sign(t, owner, Template{Name: "alice", PublicKey: c.PublicKey(), Groups: c.Groups(), NotBefore: start, NotAfter: end})
	if again.Fingerprint() != c.Fingerprint() {
		t.Error("signing the same template twice made two certificates: Ed25519 is deterministic")
	}
}

func TestString(t *testing.T) {
	owner := newOwner(t)
	tmpl := template(t)
	c := sign(t, owner, tmpl)
	s := c.String()
	for _, want := range []string{
		"name:        alice\n",
		"kind:        node\n",
		"groups:      admins, ops\n",
		"node key:    " + knownnodes.Fingerprint(tmpl.PublicKey) + "\n",
		"valid:       from 2025-06-01T11:00:00Z until 2026-06-01T12:00:00Z\n",
		"issuer:      " + owner.Public().Fingerprint() + "\n",
		"fingerprint: " + c.Fingerprint() + "\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("String lacks %q:\n%s", want, s)
		}
	}
	for _, tc := range []struct {
		nb, na time.Time
		want   string
	}{
		{time.Time{}, time.Time{}, "valid:       always\n"},
		{start, time.Time{}, "valid:       from 2025-06-01T11:00:00Z, no expiry\n"},
		{time.Time{}, end, "valid:       until 2026-06-01T12:00:00Z\n"},
	} {
		c := sign(t, owner, Template{Name: "r", Kind: KindRelay, PublicKey: tmpl.PublicKey, NotBefore: tc.nb, NotAfter: tc.na})
		if s := c.String(); !strings.Contains(s, tc.want) || !strings.Contains(s, "groups:      none\n") || !strings.Contains(s, "kind:        relay\n") {
			t.Errorf("String lacks %q:\n%s", tc.want, s)
		}
	}
}

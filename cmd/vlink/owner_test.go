package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// mustRun runs a command that must succeed, and returns its output.
func mustRun(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := runSync(args...)
	if code != base.ExitOK {
		t.Fatalf("vlink %s: exit code %d\n%s", strings.Join(args, " "), code, stderr)
	}
	return stdout, stderr
}

// newOwnerFiles makes an owner's key files in dir with vlink owner init,
// and returns their paths and the key.
func newOwnerFiles(t *testing.T, dir, name string) (key, pub string, owner *nodecert.OwnerKey) {
	t.Helper()
	key = filepath.Join(dir, name+".key")
	mustRun(t, "owner", "init", "--out", key)
	owner, err := nodecert.ReadOwnerKeyFile(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, key + ".pub", owner
}

// newNode makes a node's identity in dir with vlink key --identity, and
// its public key file with vlink key --pub; it returns that file and the
// key.
func newNode(t *testing.T, dir, name string) (pubFile string, pub []byte) {
	t.Helper()
	id := filepath.Join(dir, name+".identity")
	mustRun(t, "key", "--identity", "--out", id)
	out, _ := mustRun(t, "key", "--pub", id)
	pubFile = filepath.Join(dir, name+".pub")
	if err := os.WriteFile(pubFile, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	pub, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return pubFile, pub
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
		t.Errorf("%s: %v, %v; want mode %v", filepath.Base(path), fi.Mode(), err, want)
	}
}

// TestOwnerInit makes owner keys with vlink owner init: the private key
// of mode 600 and its public key of mode 644, a pair, never over an
// existing file unless --force.
func TestOwnerInit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing []string // files there before: "key", "pub"
		args     []string // after vlink owner init; {key} and {pub} are the files
		code     int
		want     string // in stderr
	}{
		{name: "new", args: []string{"--out", "{key}"}, want: "the owner's fingerprint: SHA256:"},
		{name: "--pub", args: []string{"--out", "{key}", "--pub", "{pub}"}, want: "public key in {pub}"},
		{name: "key exists", existing: []string{"key"}, args: []string{"--out", "{key}"}, code: base.ExitFailure, want: "{key} exists; keep it, or replace it with --force"},
		{name: "public key exists", existing: []string{"pub"}, args: []string{"--out", "{key}"}, code: base.ExitFailure, want: "{pub} exists"},
		{name: "--force", existing: []string{"key", "pub"}, args: []string{"--out", "{key}", "--force"}, want: "the owner's fingerprint"},
		{name: "flags before the verb", args: []string{"--out", "{key}", "--force"}, want: "the owner's fingerprint"},
		{name: "no --out", code: base.ExitUsage, want: "--out OWNER_KEY is required"},
		{name: "one file for both", args: []string{"--out", "{key}", "--pub", "{key}"}, code: base.ExitUsage, want: "--pub and --out both name"},
		{name: "an argument", args: []string{"--out", "{key}", "extra"}, code: base.ExitUsage, want: `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			key := filepath.Join(dir, "owner.key")
			pub := key + ".pub"
			if slices.Contains(tc.args, "--pub") {
				pub = filepath.Join(dir, "owner.public")
			}
			old := map[string][]byte{}
			for _, f := range tc.existing {
				path := map[string]string{"key": key, "pub": pub}[f]
				old[path] = []byte("old " + f + "\n")
				// Of the other's mode: --force must set the right one.
				mode := map[string]os.FileMode{"key": 0o644, "pub": 0o600}[f]
				if err := os.WriteFile(path, old[path], mode); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"owner", "init"}
			if tc.name == "flags before the verb" {
				args = []string{"owner"}
			}
			for _, a := range tc.args {
				args = append(args, strings.NewReplacer("{key}", key, "{pub}", pub).Replace(a))
			}
			if tc.name == "flags before the verb" {
				args = append(args, "init")
			}
			code, stdout, stderr := runSync(args...)
			want := strings.NewReplacer("{key}", key, "{pub}", pub).Replace(tc.want)
			if code != tc.code || !strings.Contains(stderr, want) || stdout != "" {
				t.Fatalf("exit code %d, want %d; stdout %q; stderr does not say %q:\n%s", code, tc.code, stdout, want, stderr)
			}
			for path, b := range old {
				if now, _ := os.ReadFile(path); bytes.Equal(now, b) == (code == base.ExitOK) {
					t.Errorf("%s: replaced %v, want %v", filepath.Base(path), !bytes.Equal(now, b), code == base.ExitOK)
				}
			}
			if code != base.ExitOK {
				for _, path := range []string{key, pub} {
					if _, err := os.Stat(path); old[path] == nil && err == nil {
						t.Errorf("%s made by a command that failed", filepath.Base(path))
					}
				}
				return
			}
			checkMode(t, key, 0o600)
			checkMode(t, pub, 0o644)
			owner, err := nodecert.ReadOwnerKeyFile(key)
			if err != nil {
				t.Fatal(err)
			}
			p, err := nodecert.ReadOwnerPublicKeyFile(pub)
			if err != nil || p != owner.Public() {
				t.Fatalf("the public key file holds %v (%v), want the owner's %v", p, err, owner.Public())
			}
			if !strings.Contains(stderr, owner.Public().Fingerprint()) {
				t.Errorf("stderr does not name the owner's fingerprint %s:\n%s", owner.Public().Fingerprint(), stderr)
			}
			if secret := string(owner.MarshalPEM()); strings.Contains(stderr, strings.Split(secret, "\n")[1]) {
				t.Errorf("stderr shows the private key:\n%s", stderr)
			}
		})
	}
}

// TestOwnerShow prints an owner's fingerprint from either of its files.
func TestOwnerShow(t *testing.T) {
	dir := t.TempDir()
	key, pub, owner := newOwnerFiles(t, dir, "owner")
	pubFile, _ := newNode(t, dir, "db")
	mustRun(t, "cert", "sign", "--owner", key, "--name", "db", "--pub", pubFile, "--out", filepath.Join(dir, "db.crt"))
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // stdout if the code is 0, else in stderr
	}{
		{"private key", []string{key}, base.ExitOK, owner.Public().Fingerprint() + "\n"},
		{"public key", []string{pub}, base.ExitOK, owner.Public().Fingerprint() + "\n"},
		{"a certificate", []string{filepath.Join(dir, "db.crt")}, base.ExitFailure, `want "VLINK OWNER PUBLIC KEY"`},
		{"no file", nil, base.ExitUsage, "want one file"},
		{"two files", []string{key, pub}, base.ExitUsage, "want one file"},
		{"a flag of init", []string{"--force", key}, base.ExitUsage, "--force goes with vlink owner init, not show"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runSync(append([]string{"owner", "show"}, tc.args...)...)
			if code != tc.code || (code == base.ExitOK && stdout != tc.want) || (code != base.ExitOK && !strings.Contains(stderr, tc.want)) {
				t.Errorf("exit code %d, want %d; want %q; stdout %q, stderr:\n%s", code, tc.code, tc.want, stdout, stderr)
			}
		})
	}
	if code, _, stderr := runSync("owner", "frob"); code != base.ExitUsage || !strings.Contains(stderr, `unknown "frob": want init or show`) {
		t.Errorf("vlink owner frob: exit code %d:\n%s", code, stderr)
	}
	if code, stdout, _ := runSync("owner", "init", "--help"); code != base.ExitOK || !strings.Contains(stdout, "Usage: vlink owner init") {
		t.Errorf("vlink owner init --help: exit code %d:\n%s", code, stdout)
	}
}

// TestKeyPub checks that vlink key --pub prints the public key of an
// identity, as vlink.IdentityPublic makes it and vlink key --identity
// names it, and takes no flag that makes or writes keys.
func TestKeyPub(t *testing.T) {
	dir := t.TempDir()
	id := filepath.Join(dir, "db.identity")
	_, made := mustRun(t, "key", "--identity", "--out", id)
	identity, err := vlink.ReadIdentityFile(id)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := vlink.IdentityPublic(identity)
	if err != nil {
		t.Fatal(err)
	}
	want := base64.StdEncoding.EncodeToString(pub)
	if !strings.Contains(made, "public key, no secret: "+want+" ") || !strings.Contains(made, "vlink cert sign --pub") {
		t.Errorf("vlink key --identity does not name the public key %s for vlink cert sign --pub:\n%s", want, made)
	}
	network := writeKey(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // stdout if the code is 0, else in stderr
	}{
		{"public key", []string{"--pub", id}, base.ExitOK, want + "\n"},
		{"with --identity", []string{"--pub", id, "--identity"}, base.ExitUsage, "it takes no --identity, --node or --key-file"},
		{"with --node", []string{"--pub", id, "--node", "db", "--key-file", network}, base.ExitUsage, "it takes no --identity"},
		{"with --key-file", []string{"--pub", id, "--key-file", network}, base.ExitUsage, "it takes no --identity"},
		{"with --out", []string{"--pub", id, "--out", filepath.Join(dir, "x")}, base.ExitUsage, "redirect it"},
		{"not an identity", []string{"--pub", network}, base.ExitFailure, "does not hold a base64 X25519 key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runSync(append([]string{"key"}, tc.args...)...)
			if code != tc.code || (code == base.ExitOK && stdout != tc.want) || (code != base.ExitOK && (!strings.Contains(stderr, tc.want) || stdout != "")) {
				t.Errorf("exit code %d, want %d; want %q; stdout %q, stderr:\n%s", code, tc.code, tc.want, stdout, stderr)
			}
		})
	}
}

// TestCertSign signs certificates with vlink cert sign and reads them
// back with package nodecert: what the flags said, signed by the owner.
func TestCertSign(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir) // NAME.crt goes here
	key, pub, owner := newOwnerFiles(t, dir, "owner")
	pubFile, nodeKey := newNode(t, dir, "db")
	inline := base64.StdEncoding.EncodeToString(nodeKey)
	start := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		args      []string // after --owner KEY
		file      string   // the certificate written
		groups    []string
		kind      nodecert.Kind
		nb, na    time.Time // zero: not checked
		noExpiry  bool
		wantInErr string
	}{
		{name: "node", args: []string{"--name", "db", "--pub", pubFile, "--groups", "servers,eu"},
			file: "db.crt", groups: []string{"eu", "servers"}, kind: nodecert.KindNode},
		{name: "relay, key inline", args: []string{"--name", "relay1", "--pub", inline, "--relay", "--out", "r.pem"},
			file: "r.pem", kind: nodecert.KindRelay},
		{name: "bounds", args: []string{"--name", "b", "--pub", pubFile, "--not-before", start.Format(time.RFC3339), "--valid-for", "48h"},
			file: "b.crt", nb: start, na: start.Add(48 * time.Hour)},
		{name: "no expiry", args: []string{"--name", "forever", "--pub", pubFile, "--valid-for", "0"},
			file: "forever.crt", noExpiry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := time.Now()
			_, stderr := mustRun(t, append([]string{"cert", "sign", "--owner", key}, tc.args...)...)
			checkMode(t, tc.file, 0o644)
			c, err := nodecert.ReadCertificateFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stderr, c.String()) {
				t.Errorf("stderr does not show the certificate:\n%s", stderr)
			}
			if c.Name() != tc.args[1] || !slices.Equal(c.Groups(), tc.groups) || c.Kind() != tc.kind || !bytes.Equal(c.PublicKey(), nodeKey) {
				t.Errorf("certificate of %s %s, groups %q, key %x; want %s %s, %q, %x", c.Kind(), c.Name(), c.Groups(), c.PublicKey(), tc.kind, tc.args[1], tc.groups, nodeKey)
			}
			if err := c.Verify(owner.Public(), c.NotBefore().Add(time.Second)); err != nil {
				t.Errorf("Verify: %v", err)
			}
			switch {
			case !tc.nb.IsZero():
				if !c.NotBefore().Equal(tc.nb) || !c.NotAfter().Equal(tc.na) {
					t.Errorf("valid from %v until %v, want %v until %v", c.NotBefore(), c.NotAfter(), tc.nb, tc.na)
				}
			case tc.noExpiry:
				if !c.NotAfter().IsZero() {
					t.Errorf("--valid-for 0 expires at %v", c.NotAfter())
				}
			default:
				// From a little before now, for a year.
				if nb := c.NotBefore(); nb.After(before) || nb.Before(before.Add(-10*time.Minute)) {
					t.Errorf("valid from %v, signed at %v", nb, before)
				}
				if d := c.NotAfter().Sub(c.NotBefore()); d != 8760*time.Hour {
					t.Errorf("valid for %v, want 8760h", d)
				}
				if err := c.Verify(owner.Public(), time.Now()); err != nil {
					t.Errorf("Verify now: %v", err)
				}
			}
		})
	}

	old, _ := os.ReadFile("db.crt")
	if code, _, stderr := runSync("cert", "sign", "--owner", key, "--name", "db", "--pub", pubFile); code != base.ExitFailure || !strings.Contains(stderr, "db.crt exists") {
		t.Errorf("signing over db.crt: exit code %d:\n%s", code, stderr)
	}
	if now, _ := os.ReadFile("db.crt"); !bytes.Equal(now, old) {
		t.Error("db.crt replaced without --force")
	}
	mustRun(t, "cert", "sign", "--owner", key, "--name", "db", "--pub", pubFile, "--force")
	if now, _ := os.ReadFile("db.crt"); bytes.Equal(now, old) {
		t.Error("--force left db.crt as it was")
	}

	// A file that holds no key, but a secret: neither is shown.
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte("S3cret Qu1x\n"), 0o644)
	short := base64.StdEncoding.EncodeToString(nodeKey[:16])
	for _, tc := range []struct {
		name string
		args []string // after vlink cert sign
		want string   // in stderr
	}{
		{"bad name", []string{"--owner", key, "--name", "Bad_Name", "--pub", pubFile}, `--name "Bad_Name": invalid node name: want 1..63 lower-case letters`},
		{"bad group", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--groups", "ops,Bad_Group"}, `--groups: "Bad_Group" is not a group's name`},
		{"empty group", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--groups", "ops,"}, `--groups: "" is not a group's name`},
		{"group twice", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--groups", "ops,ops"}, `group "ops" given twice`},
		{"key too short", []string{"--owner", key, "--name", "db2", "--pub", short}, "nor an X25519 public key in base64"},
		{"no such key file", []string{"--owner", key, "--name", "db2", "--pub", filepath.Join(dir, "nope.pub")}, "no such file"},
		{"no key in the file", []string{"--owner", key, "--name", "db2", "--pub", secretFile}, "does not hold an X25519 public key"},
		{"no --owner", []string{"--name", "db2", "--pub", pubFile}, "--owner OWNER_KEY is required"},
		{"owner's public key", []string{"--owner", pub, "--name", "db2", "--pub", pubFile}, "holds the owner's public key: signing takes the private key"},
		{"no --name", []string{"--owner", key, "--pub", pubFile}, "--name NAME is required"},
		{"no --pub", []string{"--owner", key, "--name", "db2"}, "--pub PUBKEY is required"},
		{"negative --valid-for", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--valid-for", "-1h"}, "--valid-for -1h0m0s: want a positive duration, or 0"},
		{"bad --not-before", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--not-before", "yesterday"}, "want a time in RFC 3339"},
		{"a flag of show", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "--revocations", "r"}, "--revocations goes with vlink cert show or revoke, not sign"},
		{"an argument", []string{"--owner", key, "--name", "db2", "--pub", pubFile, "extra"}, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runSync(append([]string{"cert", "sign"}, tc.args...)...)
			if code != base.ExitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
				t.Errorf("exit code %d, want %d; stdout %q; stderr does not say %q:\n%s", code, base.ExitUsage, stdout, tc.want, stderr)
			}
			if leaked(stderr) != nil {
				t.Errorf("stderr shows %q:\n%s", leaked(stderr), stderr)
			}
			if _, err := os.Stat("db2.crt"); err == nil {
				os.Remove("db2.crt")
				t.Error("db2.crt written")
			}
		})
	}
}

// TestCertShow checks certificates against their owner with vlink cert
// show --owner: a good one passes, one of another owner, an expired one
// and a revoked one are refused with the reason, and the exit code says
// so.
func TestCertShow(t *testing.T) {
	dir := t.TempDir()
	key, pub, _ := newOwnerFiles(t, dir, "owner")
	otherKey, _, _ := newOwnerFiles(t, dir, "other")
	pubFile, _ := newNode(t, dir, "db")
	cert := func(name string, args ...string) string {
		out := filepath.Join(dir, name+".crt")
		mustRun(t, append([]string{"cert", "sign", "--name", name, "--pub", pubFile, "--out", out}, args...)...)
		return out
	}
	good := cert("good", "--owner", key)
	foreign := cert("foreign", "--owner", otherKey)
	expired := cert("expired", "--owner", key, "--not-before", "2020-01-01T00:00:00Z", "--valid-for", "1h")
	future := cert("future", "--owner", key, "--not-before", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	revoked := cert("revoked", "--owner", key)
	list := filepath.Join(dir, "revoked.txt")
	mustRun(t, "cert", "revoke", "--revocations", list, revoked)
	for _, tc := range []struct {
		name  string
		args  []string // after vlink cert show
		code  int
		check []string // the check: lines, in order; nil: none
		err   string   // in stderr
	}{
		{"good", []string{"--owner", pub, good}, base.ExitOK, []string{"valid"}, ""},
		{"against the private key", []string{"--owner", key, good}, base.ExitOK, []string{"valid"}, ""},
		{"no check", []string{good, foreign, expired}, base.ExitOK, nil, ""},
		{"another owner's", []string{"--owner", pub, foreign}, base.ExitFailure, []string{"REFUSED: not issued by this network's owner"}, "1 of 1 certificates refused"},
		{"expired", []string{"--owner", pub, expired}, base.ExitFailure, []string{"REFUSED: expired at 2020-01-01T01:00:00Z"}, "refused"},
		{"not yet valid", []string{"--owner", pub, future}, base.ExitFailure, []string{"REFUSED: not yet valid"}, "refused"},
		{"revoked", []string{"--owner", pub, "--revocations", list, good, revoked}, base.ExitFailure, []string{"valid, not revoked", "REFUSED: revoked"}, "1 of 2 certificates refused"},
		{"revoked, without the list", []string{"--owner", pub, revoked}, base.ExitOK, []string{"valid"}, ""},
		{"unreadable", []string{"--owner", pub, good, pubFile}, base.ExitFailure, []string{"valid"}, "1 of 2 certificates unreadable"},
		{"no files", []string{"--owner", pub}, base.ExitUsage, nil, "give the certificates' files"},
		{"--revocations without --owner", []string{"--revocations", list, good}, base.ExitUsage, nil, "--revocations needs --owner"},
		{"a flag after the files", []string{good, "--owner", pub}, base.ExitUsage, nil, "flags go before the arguments"},
		{"a flag of sign", []string{"--owner", pub, "--relay", good}, base.ExitUsage, nil, "--relay goes with vlink cert sign, not show"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runSync(append([]string{"cert", "show"}, tc.args...)...)
			var checks []string
			for line := range strings.Lines(stdout) {
				if v, ok := strings.CutPrefix(line, "check:"); ok {
					checks = append(checks, strings.TrimSpace(v))
				}
			}
			ok := code == tc.code && len(checks) == len(tc.check) && strings.Contains(stderr, tc.err)
			for i := range checks {
				ok = ok && i < len(tc.check) && strings.HasPrefix(checks[i], tc.check[i])
			}
			if !ok {
				t.Errorf("exit code %d, want %d; checks %q, want %q; stderr (want %q):\n%s\nstdout:\n%s", code, tc.code, checks, tc.check, tc.err, stderr, stdout)
			}
			if code == base.ExitOK && !strings.Contains(stdout, "fingerprint: SHA256:") {
				t.Errorf("no fingerprint shown:\n%s", stdout)
			}
		})
	}
}

// TestCertRevoke adds certificates to a revocation list, by file and by
// fingerprint, and checks that the list stays one ParseRevocations reads.
func TestCertRevoke(t *testing.T) {
	dir := t.TempDir()
	key, _, _ := newOwnerFiles(t, dir, "owner")
	pubFile, _ := newNode(t, dir, "db")
	var certs []*nodecert.Certificate
	var files []string
	for _, name := range []string{"a", "b", "c"} {
		f := filepath.Join(dir, name+".crt")
		mustRun(t, "cert", "sign", "--owner", key, "--name", name, "--pub", pubFile, "--out", f)
		c, err := nodecert.ReadCertificateFile(f)
		if err != nil {
			t.Fatal(err)
		}
		certs, files = append(certs, c), append(files, f)
	}
	list := filepath.Join(dir, "revoked.txt")
	const kept = "# the list so far\nSHA256:6Gp2ZcXhRQ0v0H2c8mFqfJ3y6bDkzC1u8Q2j3pT1a0M  # no newline at the end"
	for _, tc := range []struct {
		name    string
		before  string // the list's text before; "-" for no list
		args    []string
		code    int
		revoked []int  // certificates revoked after
		want    string // in stderr
	}{
		{"new list", "-", []string{files[0]}, base.ExitOK, []int{0}, "revoked " + certs[0].Fingerprint() + " (node a)"},
		{"by fingerprint", "", []string{certs[1].Fingerprint()}, base.ExitOK, []int{1}, "revoked " + certs[1].Fingerprint()},
		{"appended", kept, []string{files[0], files[2]}, base.ExitOK, []int{0, 2}, "(node c)"},
		{"already", certs[0].Fingerprint() + "\n", []string{files[0]}, base.ExitOK, []int{0}, "is on the list already"},
		{"malformed list", "not a fingerprint\n", []string{files[0]}, base.ExitFailure, nil, "fix it first, nothing was added"},
		{"bad fingerprint", "", []string{"SHA256:xyz"}, base.ExitUsage, nil, "is not a certificate's fingerprint"},
		{"no certificates", "", nil, base.ExitUsage, nil, "give the certificates to revoke"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(list)
			if tc.before != "-" {
				if err := os.WriteFile(list, []byte(tc.before), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			code, _, stderr := runSync(append([]string{"cert", "revoke", "--revocations", list}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit code %d, want %d; stderr does not say %q:\n%s", code, tc.code, tc.want, stderr)
			}
			text, err := os.ReadFile(list)
			if tc.before == "-" && code != base.ExitOK {
				if err == nil {
					t.Error("a list made by a command that failed")
				}
				return
			}
			if code != base.ExitOK || tc.name == "already" {
				if string(text) != tc.before {
					t.Errorf("the list changed:\n%s", text)
				}
				return
			}
			if !strings.HasPrefix(string(text), tc.before) && tc.before != "-" {
				t.Errorf("the list lost what it held:\n%s", text)
			}
			r, err := nodecert.ParseRevocations(text)
			if err != nil {
				t.Fatalf("the list does not parse: %v\n%s", err, text)
			}
			for i, c := range certs {
				if r.Revoked(c) != slices.Contains(tc.revoked, i) {
					t.Errorf("certificate %s revoked %v, want %v:\n%s", c.Name(), r.Revoked(c), !r.Revoked(c), text)
				}
			}
			want := os.FileMode(0o640)
			if tc.before == "-" {
				want = 0o644
			}
			checkMode(t, list, want)
		})
	}
}

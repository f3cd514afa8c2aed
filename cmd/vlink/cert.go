package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

var certCmd = &cli.Command{
	Name:     "cert",
	Summary:  "sign, show and revoke the certificates of a vlink network's nodes",
	Synopsis: "sign --owner OWNER_KEY --name NAME --pub PUBKEY [flags] | show [--owner OWNER_PUB [--revocations FILE]] CERT... | revoke --revocations FILE CERT...",
	About: `
A node's certificate binds its name, its groups and its kind (a node, or a
relay) to the node's own public key, for a time, with the signature of the
network's owner (vlink owner init makes the owner's key).

vlink cert sign makes one. The node makes its key and keeps the private
half (vlink key --identity --out FILE), and gives the owner the public half
(vlink key --pub FILE prints it): --pub takes it in base64, or the file
holding that line, never the identity itself. The certificate goes to
--out (default NAME.crt), mode 644 (an existing file is left alone unless
--force), and what it says to standard error.

vlink cert show CERT... prints each certificate: name, kind, groups, the
fingerprint of the node's key, validity, the fingerprint of the owner that
issued it, and its own fingerprint, the one a revocation list names. With
--owner, it checks each against that owner's key (public, or private) at
the current time and says "valid" or why not, and with --revocations also
whether the list revokes it; exit status 1 if any certificate is refused
or unreadable.

vlink cert revoke --revocations FILE CERT... adds certificates to a
revocation list, creating it if missing: a text file of one fingerprint a
line, each with a # comment naming the certificate and the date. CERT is a
certificate's file, or its fingerprint (SHA256:..., as vlink cert show
prints it) when the file is lost. The list is replaced at once, never left
half-written, and a list that does not parse is refused untouched.
`,
	Examples: `
  vlink owner init --out owner.key
  vlink key --identity --out db.identity
  vlink key --pub db.identity > db.pub
  vlink cert sign --owner owner.key --name db --groups servers,eu --pub db.pub
  vlink cert show --owner owner.key.pub db.crt
  vlink cert revoke --revocations revoked.txt db.crt
`,
	Flags: base.WithEnv(certFlags),
	Args:  true,
}

// Defaults of vlink cert sign.
const (
	defaultValidFor = 365 * 24 * time.Hour
	// backdate is how long before now a certificate starts by default,
	// so that a node whose clock is a little behind takes it at once.
	backdate = 5 * time.Minute
)

type signOptions struct {
	owner, name, pub, groups, notBefore, out string
	relay, force                             bool
	validFor                                 time.Duration
}

func certFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	var o signOptions
	var revocations string
	fs.StringVar(&o.owner, "owner", "", "the network owner's key in `FILE`: sign takes the private key (vlink owner init --out); show takes the public key (or the private one) to check the certificates against (default for show: no check)")
	fs.StringVar(&o.name, "name", "", "sign the certificate of the node called `NAME`: 1 to 63 lower-case letters, digits and '-', starting with a letter (sign; required)")
	fs.StringVar(&o.pub, "pub", "", "sign the node's public key `PUBKEY`: base64, as vlink key --pub IDENTITY prints it, or a file holding that line (sign; required)")
	fs.StringVar(&o.groups, "groups", "", "put the node in the groups of `LIST`, comma-separated, each named as nodes are (default: none; sign only)")
	fs.BoolVar(&o.relay, "relay", false, "sign a relay's certificate rather than a node's (sign only)")
	fs.DurationVar(&o.validFor, "valid-for", defaultValidFor, "the certificate expires `DURATION` after --not-before; 0: it never expires (default: 8760h, a year; sign only)")
	fs.StringVar(&o.notBefore, "not-before", "", "the certificate is valid from `TIME`, in RFC 3339 such as 2025-06-01T00:00:00Z (default: 5 minutes ago, so that clocks a little behind take it at once; sign only)")
	fs.StringVar(&o.out, "out", "", "write the certificate to `FILE`, created with mode 644 (default: NAME.crt; sign only)")
	fs.BoolVar(&o.force, "force", false, "let --out replace an existing file (sign only)")
	fs.StringVar(&revocations, "revocations", "", "the revocation list in `FILE`: show reports the certificates it revokes (with --owner); revoke adds to it")
	verbs := []verb{
		{name: "sign", flags: []string{"owner", "name", "pub", "groups", "relay", "valid-for", "not-before", "out", "force"}, run: func(e *base.Env, args []string) error {
			if len(args) > 0 {
				return base.Usagef("unexpected argument %q (every option of sign is a --flag)", args[0])
			}
			return o.sign(e, time.Now())
		}},
		{name: "show", flags: []string{"owner", "revocations"}, run: func(e *base.Env, args []string) error {
			return certShow(e, o.owner, revocations, args, time.Now())
		}},
		{name: "revoke", flags: []string{"revocations"}, run: func(e *base.Env, args []string) error {
			return certRevoke(e, revocations, args, time.Now())
		}},
	}
	return func(ctx context.Context, e *base.Env) int { return runVerb(fs, e, "cert", verbs) }
}

func (o *signOptions) sign(e *base.Env, now time.Time) error {
	t := nodecert.Template{Name: o.name}
	switch {
	case o.owner == "":
		return base.Usagef("--owner OWNER_KEY is required: the owner's private key signs (vlink owner init --out FILE makes one)")
	case o.name == "":
		return base.Usagef("--name NAME is required: the name of the node the certificate is for")
	case !vlink.ValidNodeName(o.name):
		return base.Usagef("--name %q: %v", o.name, vlink.ErrBadNodeName)
	case o.pub == "":
		return base.Usagef("--pub PUBKEY is required: the node's public key, which vlink key --pub IDENTITY prints on the node")
	case o.validFor < 0:
		return base.Usagef("--valid-for %v: want a positive duration, or 0 for a certificate that never expires", o.validFor)
	}
	if o.groups != "" {
		for g := range strings.SplitSeq(o.groups, ",") {
			if g = strings.TrimSpace(g); !nodecert.ValidGroup(g) {
				return base.Usagef("--groups: %q is not a group's name: want 1 to %d lower-case letters, digits and '-', starting with a letter and not ending with '-', the groups separated by commas", g, nodecert.MaxGroupLen)
			}
			t.Groups = append(t.Groups, g)
		}
	}
	if o.relay {
		t.Kind = nodecert.KindRelay
	}
	t.NotBefore = now.Add(-backdate)
	if o.notBefore != "" {
		var err error
		if t.NotBefore, err = time.Parse(time.RFC3339, o.notBefore); err != nil {
			return base.Usagef("--not-before %q: want a time in RFC 3339, such as 2025-06-01T00:00:00Z", o.notBefore)
		}
	}
	if o.validFor > 0 {
		t.NotAfter = t.NotBefore.Add(o.validFor)
	}
	var err error
	if t.PublicKey, err = readNodePublicKey(e, o.pub); err != nil {
		return err
	}
	if isPEM(o.owner, nodecert.PEMOwnerPublicKey) {
		return base.Usagef("--owner %s holds the owner's public key: signing takes the private key (vlink owner init --out FILE)", o.owner)
	}
	owner, err := nodecert.ReadOwnerKeyFile(o.owner)
	if err != nil {
		return err
	}
	c, err := nodecert.Sign(owner, t)
	if errors.Is(err, nodecert.ErrInvalidTemplate) {
		// What the checks above leave to Sign: a group given twice, too
		// many groups, an all-zero key, a bound out of range.
		return base.Usagef("%v", err)
	}
	if err != nil {
		return err
	}
	out := o.out
	if out == "" {
		out = o.name + ".crt"
	}
	if err := writeFileOut(out, o.force, 0o644, c.MarshalPEM()); err != nil {
		return err
	}
	fmt.Fprintf(e.Stderr, "vlink cert sign: wrote the certificate to %s:\n%s", out, c)
	return nil
}

// readNodePublicKey reads --pub: a file holding a node's X25519 public
// key in base64, or the key itself. Errors never show what the file
// holds.
func readNodePublicKey(e *base.Env, arg string) ([]byte, error) {
	if fi, err := os.Stat(arg); err != nil || fi.IsDir() {
		k, err := base64.StdEncoding.Strict().DecodeString(arg)
		if err != nil || len(k) != nodecert.KeySize {
			return nil, base.Usagef("--pub %q: no such file, nor an X25519 public key in base64, %d characters as vlink key --pub IDENTITY prints it", arg, base64.StdEncoding.EncodedLen(nodecert.KeySize))
		}
		return k, nil
	}
	f, err := os.Open(arg)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1024))
	if err != nil {
		return nil, err
	}
	k, err := base64.StdEncoding.Strict().DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(k) != nodecert.KeySize {
		return nil, base.Usagef("--pub %s does not hold an X25519 public key in base64, one line of %d characters, as vlink key --pub IDENTITY prints it", arg, base64.StdEncoding.EncodedLen(nodecert.KeySize))
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 == 0 {
		// An identity file looks the same, and vlink key --identity
		// makes it of mode 600: a key signed from it is no node's.
		fmt.Fprintf(e.Stderr, "vlink cert sign: warning: %s may be read by its owner only, as a private key: if it is the node's identity, do not use this certificate, and sign the output of vlink key --pub %s instead\n", arg, arg)
	}
	return k, nil
}

// certShow prints the certificates in files, checked against the owner
// in ownerFile if given, and the revocation list in revocations.
func certShow(e *base.Env, ownerFile, revocations string, files []string, now time.Time) error {
	switch {
	case len(files) == 0:
		return base.Usagef("give the certificates' files")
	case revocations != "" && ownerFile == "":
		return base.Usagef("--revocations needs --owner OWNER_PUB: a certificate is checked against its owner first")
	}
	var trust *nodecert.Trust
	if ownerFile != "" {
		owner, err := readOwnerPublic(ownerFile)
		if err != nil {
			return err
		}
		if trust, err = nodecert.NewTrust(owner, revocations); err != nil {
			return err
		}
	}
	unreadable, refused, shown := 0, 0, 0
	for _, path := range files {
		c, err := nodecert.ReadCertificateFile(path)
		if err != nil {
			fmt.Fprintf(e.Stderr, "vlink cert show: %v\n", err)
			unreadable++
			continue
		}
		if shown++; shown > 1 {
			fmt.Fprintln(e.Stdout)
		}
		fmt.Fprintf(e.Stdout, "%-12s %s\n%s", "file:", path, c)
		if trust == nil {
			continue
		}
		status := "valid"
		if revocations != "" {
			status = "valid, not revoked"
		}
		if err := trust.Check(c, now); err != nil {
			refused++
			status = "REFUSED: " + refusal(err)
		}
		fmt.Fprintf(e.Stdout, "%-12s %s\n", "check:", status)
	}
	switch {
	case unreadable > 0 && refused > 0:
		return fmt.Errorf("of %d certificates, %d unreadable, %d refused", len(files), unreadable, refused)
	case unreadable > 0:
		return fmt.Errorf("%d of %d certificates unreadable", unreadable, len(files))
	case refused > 0:
		return fmt.Errorf("%d of %d certificates refused, against the owner %s", refused, len(files), trust.Owner().Fingerprint())
	}
	return nil
}

// refusal says why a certificate was refused, its fields printed
// already.
func refusal(err error) string {
	var ce *nodecert.CertificateError
	if errors.As(err, &ce) {
		err = ce.Err
	}
	if errors.Is(err, nodecert.ErrRevoked) {
		return "revoked: on the revocation list"
	}
	return err.Error()
}

// certRevoke adds the certificates args name (files or fingerprints) to
// the revocation list in the file list.
func certRevoke(e *base.Env, list string, args []string, now time.Time) error {
	switch {
	case list == "":
		return base.Usagef("--revocations FILE is required: the revocation list to add to (created if missing)")
	case len(args) == 0:
		return base.Usagef("give the certificates to revoke: their files, or their fingerprints (SHA256:..., as vlink cert show prints them)")
	}
	path := list
	if p, err := filepath.EvalSymlinks(list); err == nil {
		path = p // replace the file a link names, not the link
	}
	perm := os.FileMode(0o644)
	old, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		old = nil
	case err != nil:
		return err
	default:
		if fi, err := os.Stat(path); err == nil {
			perm = fi.Mode().Perm()
		}
	}
	have, err := nodecert.ParseRevocations(old)
	if err != nil {
		return fmt.Errorf("%s: %w; fix it first, nothing was added", list, err)
	}
	listed := map[string]bool{}
	for _, fp := range have.Fingerprints() {
		listed[fp] = true
	}
	var lines []byte
	var added []string
	for _, a := range args {
		fp, about, err := revocationOf(a)
		if err != nil {
			return err
		}
		shown, comment := fp, "revoked "+now.UTC().Format(time.RFC3339)
		if about != "" {
			shown, comment = fp+" ("+about+")", about+", "+comment
		}
		if listed[fp] {
			fmt.Fprintf(e.Stderr, "vlink cert revoke: %s is on the list already\n", shown)
			continue
		}
		listed[fp] = true
		lines = fmt.Appendf(lines, "%s  # %s\n", fp, comment)
		added = append(added, shown)
	}
	if len(added) == 0 {
		return nil
	}
	data := old
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, lines...)
	if _, err := nodecert.ParseRevocations(data); err != nil {
		return fmt.Errorf("%s: the list would not parse: %w", list, err) // cannot happen: nothing written
	}
	if err := replaceFile(path, perm, data); err != nil {
		return err
	}
	for _, a := range added {
		fmt.Fprintf(e.Stderr, "vlink cert revoke: revoked %s in %s\n", a, list)
	}
	return nil
}

// revocationOf returns the fingerprint of the certificate arg names, a
// file or a fingerprint, and what the list's comment says of it ("node
// db" for a file).
func revocationOf(arg string) (fp, about string, err error) {
	if strings.HasPrefix(arg, "SHA256:") {
		// The list's own parser decides what a fingerprint is.
		r, err := nodecert.ParseRevocations([]byte(arg))
		if err != nil || r.Len() != 1 || strings.ContainsAny(arg, "#\n") {
			return "", "", base.Usagef("%q is not a certificate's fingerprint: want SHA256: and 43 characters of base64, as vlink cert show prints it", arg)
		}
		return r.Fingerprints()[0], "", nil
	}
	c, err := nodecert.ReadCertificateFile(arg)
	if err != nil {
		return "", "", err
	}
	return c.Fingerprint(), c.Kind().String() + " " + c.Name(), nil
}

// replaceFile replaces the file at path with one of mode perm holding
// data, through a file beside it renamed over it: whoever reads path
// sees the old list or the new one, never half of it.
func replaceFile(path string, perm os.FileMode, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

package main

import (
	"context"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

var ownerCmd = &cli.Command{
	Name:     "owner",
	Summary:  "make a vlink network owner's key, which signs the certificates of its nodes",
	Synopsis: "init --out OWNER_KEY [--pub FILE] [--force] | show FILE",
	About: `
The owner of a vlink network holds an Ed25519 key that signs the
certificates of its nodes and relays (vlink cert sign): each binds a node's
name and groups to the node's own key (vlink key --identity), whose private
half never leaves the node.

vlink owner init makes the owner's key. The private key goes to --out, a
new file of mode 600 (an existing file is left alone unless --force), and
the public key, which certificates are checked against (vlink cert show
--owner), to --pub, mode 644. It prints the owner's fingerprint
(SHA256:...) on standard error. Keep the private key offline if you can:
whoever holds it can sign any name into the network, and replacing it means
signing every certificate again.

vlink owner show FILE prints the fingerprint of the owner's key in FILE,
public or private: the issuer vlink cert show names.
`,
	Examples: `
  vlink owner init --out owner.key
  vlink owner show owner.key.pub
`,
	Flags: base.WithEnv(ownerFlags),
	Args:  true,
}

func ownerFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	var out, pub string
	var force bool
	fs.StringVar(&out, "out", "", "write the owner's private key to `FILE`, created with mode 600 (init; required)")
	fs.StringVar(&pub, "pub", "", "write the owner's public key to `FILE`, created with mode 644 (default: the --out file's name and .pub; init only)")
	fs.BoolVar(&force, "force", false, "let --out and --pub replace existing files: the owner's key is then a new one, and every certificate must be signed again (init only)")
	verbs := []verb{
		{name: "init", flags: []string{"out", "pub", "force"}, run: func(e *base.Env, args []string) error {
			if len(args) > 0 {
				return base.Usagef("unexpected argument %q (init takes --out OWNER_KEY)", args[0])
			}
			return ownerInit(e, out, pub, force)
		}},
		{name: "show", run: func(e *base.Env, args []string) error {
			if len(args) != 1 {
				return base.Usagef("want one file, the owner's public or private key (got %d arguments)", len(args))
			}
			k, err := readOwnerPublic(args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(e.Stdout, k.Fingerprint())
			return err
		}},
	}
	return func(ctx context.Context, e *base.Env) int { return runVerb(fs, e, "owner", verbs) }
}

func ownerInit(e *base.Env, out, pub string, force bool) error {
	if out == "" {
		return base.Usagef("--out OWNER_KEY is required: the file to keep the owner's private key in")
	}
	if pub == "" {
		pub = out + ".pub"
	}
	if filepath.Clean(pub) == filepath.Clean(out) {
		return base.Usagef("--pub and --out both name %s: the public key goes to a file of its own", out)
	}
	if !force {
		// Both files or neither: no private key left without its public one.
		for _, p := range []string{out, pub} {
			if _, err := os.Lstat(p); err == nil {
				return existsError(p)
			}
		}
	}
	k, err := nodecert.NewOwner()
	if err != nil {
		return err
	}
	if err := writeOwnerKey(out, k, force); err != nil {
		return err
	}
	if err := writeFileOut(pub, force, 0o644, k.Public().MarshalPEM()); err != nil {
		if !force {
			os.Remove(out) // made just now: a new key nobody has the public half of
			return err
		}
		return fmt.Errorf("the new owner key is in %s, but its public key is not in %s: %w", out, pub, err)
	}
	fmt.Fprintf(e.Stderr, "vlink owner init: the owner's fingerprint: %s\n", k.Public().Fingerprint())
	fmt.Fprintf(e.Stderr, "vlink owner init: private key in %s (mode 600: keep it secret, offline if you can), public key in %s\n", out, pub)
	return nil
}

// writeOwnerKey writes k to path, a new file unless force. Replacing
// goes through a file beside it, renamed over the old one, so that a
// write that fails leaves the old key whole.
func writeOwnerKey(path string, k *nodecert.OwnerKey, force bool) error {
	if !force {
		err := nodecert.WriteOwnerKeyFile(path, k)
		if errors.Is(err, fs.ErrExist) {
			return existsError(path)
		}
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	// WriteOwnerKeyFile creates its file, with mode 600 from the start.
	tmp.Close()
	os.Remove(tmp.Name())
	if err := nodecert.WriteOwnerKeyFile(tmp.Name(), k); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// readOwnerPublic reads the owner's public key from a file holding it,
// or holding the private key (read as such: of mode 600).
func readOwnerPublic(path string) (nodecert.OwnerPublicKey, error) {
	if isPEM(path, nodecert.PEMOwnerPrivateKey) {
		k, err := nodecert.ReadOwnerKeyFile(path)
		if err != nil {
			return nodecert.OwnerPublicKey{}, err
		}
		return k.Public(), nil
	}
	return nodecert.ReadOwnerPublicKeyFile(path)
}

// isPEM reports whether the file at path starts with a PEM block of type
// typ. It reads the file only to look: the readers check it.
func isPEM(path, typ string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 4096))
	block, _ := pem.Decode(b)
	return block != nil && block.Type == typ
}

// A verb is one of the actions of a command that has several, named by
// its first argument: vlink owner init, vlink cert sign. Package cli has
// no subcommands, so such a command defines every verb's flags, and
// runVerb parses those given after the verb.
type verb struct {
	name  string
	flags []string // the command's flags the verb takes, --log-level and --log-format aside
	run   func(e *base.Env, args []string) error
}

// runVerb runs the verb e.Args names, parsing the flags after it into
// fs, which defines the command's flags (those before it are parsed
// already). A flag of another verb is a usage error.
func runVerb(fs *flag.FlagSet, e *base.Env, cmd string, verbs []verb) int {
	var names []string
	for _, v := range verbs {
		names = append(names, v.name)
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	if len(e.Args) == 0 {
		return base.Fail(e, "vlink "+cmd, base.Usagef("say what to do: vlink %s %s", cmd, strings.Join(names, "|")))
	}
	i := slices.IndexFunc(verbs, func(v verb) bool { return v.name == e.Args[0] })
	if i < 0 {
		return base.Fail(e, "vlink "+cmd, base.Usagef("unknown %q: want %s", e.Args[0], want))
	}
	v := verbs[i]
	who := "vlink " + cmd + " " + v.name
	rest := e.Args[1:]
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandHelp(e.Stdout, cmd)
			return base.ExitOK
		}
		return base.Fail(e, who, base.Usagef("%v", err))
	}
	var err error
	fs.Visit(func(f *flag.Flag) {
		if err != nil || f.Name == "log-level" || f.Name == "log-format" || slices.Contains(v.flags, f.Name) {
			return
		}
		var of []string
		for _, o := range verbs {
			if slices.Contains(o.flags, f.Name) {
				of = append(of, o.name)
			}
		}
		err = base.Usagef("--%s goes with vlink %s %s, not %s", f.Name, cmd, strings.Join(of, " or "), v.name)
	})
	if err != nil {
		return base.Fail(e, who, err)
	}
	args := fs.Args()
	if !slices.Contains(rest[:len(rest)-len(args)], "--") {
		for j, a := range args {
			if j > 0 && len(a) > 1 && a[0] == '-' {
				return base.Fail(e, who, base.Usagef("%s after %s: flags go before the arguments", a, args[j-1]))
			}
		}
	}
	return base.Fail(e, who, v.run(e, args))
}

// commandHelp prints the --help of the command called name, for
// "vlink owner init --help". It is set in init: the commands cannot
// refer to program, which lists them.
var commandHelp func(w io.Writer, name string)

func init() {
	commandHelp = func(w io.Writer, name string) {
		program.Run(context.Background(), []string{name, "--help"}, w, io.Discard)
	}
}

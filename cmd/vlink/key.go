package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/knownnodes"
)

var keyCmd = &cli.Command{
	Name:     "key",
	Summary:  "make a pre-shared key or an identity, print an identity's public key, or derive a node's key",
	Synopsis: "[--node NAME --key-file NETWORK_KEY | --identity | --pub IDENTITY] [--out FILE] [flags]",
	About: `
Without --node, makes a fresh random key (32 random bytes, in base64): the
key of a vlink serve and its tunnels, or the network key of a vlink relay.

With --node, derives from the network key in --key-file the key of the node
called NAME. Give each node only its own key: the relay derives the same key
from the name a node claims, so a node can prove no other node's name. The
network key can act as any node: it belongs on the relay only.

With --identity, makes a listener's identity instead: an X25519 private key
(in base64) for vlink serve --identity, and prints its fingerprint (SHA256:...)
on standard error. Dialers pin that fingerprint the first time they reach the
listener through an encrypted stack, and refuse it afterwards if the identity
changes (see --known-nodes of tunnel, socks and exec): compare it with the one
a dialer prints when it pins, as with a new SSH host key. It prints the
identity's public key there too.

With --pub, prints the public key of the identity in FILE, in base64, as wg
pubkey does: no secret, it is what the network's owner signs into a node's
certificate (vlink cert sign --pub). It goes to standard output only.

The key goes to standard output, or with --out to a new file of mode 600
(an existing file is left alone unless --force).
`,
	Examples: `
  vlink key --out network.key
  vlink key --node db --key-file network.key --out db.key
  vlink key --identity --out gw.identity
  vlink key --pub gw.identity > gw.pub
`,
	Flags: base.WithEnv(keyFlags),
}

func keyFlags(fs *flag.FlagSet) func(context.Context, *base.Env) int {
	var node, keyFile, out, pubOf string
	var force, identity bool
	fs.StringVar(&node, "node", "", "derive the key of the node called `NAME` (needs --key-file)")
	fs.StringVar(&keyFile, "key-file", "", "the network key, in `FILE` (mode 600), to derive a node's key from")
	fs.StringVar(&out, "out", "", "write the key to `FILE`, created with mode 600 (default: standard output)")
	fs.BoolVar(&force, "force", false, "let --out replace an existing file")
	fs.BoolVar(&identity, "identity", false, "make a listener's identity (for vlink serve --identity) and print its fingerprint and public key")
	fs.StringVar(&pubOf, "pub", "", "print the public key of the identity in `FILE` (mode 600; vlink key --identity makes one), in base64, for vlink cert sign --pub")
	return func(ctx context.Context, e *base.Env) int {
		if pubOf != "" {
			if err := printPublicKey(e, pubOf, identity || node != "" || keyFile != "", out != "" || force); err != nil {
				return base.Fail(e, "vlink key", err)
			}
			return base.ExitOK
		}
		if identity {
			if node != "" || keyFile != "" {
				return base.Fail(e, "vlink key", base.Usagef("--identity makes a fresh identity: it takes no --node or --key-file"))
			}
			id := vlink.NewIdentity()
			pub, _ := vlink.IdentityPublic(id)
			if err := writeKeyOut(e, out, force, base64.StdEncoding.AppendEncode(nil, id)); err != nil {
				return base.Fail(e, "vlink key", err)
			}
			fmt.Fprintf(e.Stderr, "vlink key: the identity's fingerprint, which dialers pin: %s\n", knownnodes.Fingerprint(pub))
			fmt.Fprintf(e.Stderr, "vlink key: its public key, no secret: %s (give it to the network's owner, for vlink cert sign --pub)\n", base64.StdEncoding.EncodeToString(pub))
			return base.ExitOK
		}
		key, err := makeKey(node, keyFile)
		if err == nil {
			err = writeKeyOut(e, out, force, key)
		}
		if err != nil {
			return base.Fail(e, "vlink key", err)
		}
		return base.ExitOK
	}
}

// printPublicKey prints the public key of the identity in the file
// path, refusing the flags that make or write keys (other, out).
func printPublicKey(e *base.Env, path string, other, out bool) error {
	switch {
	case other:
		return base.Usagef("--pub prints the public key of an identity made already: it takes no --identity, --node or --key-file")
	case out:
		return base.Usagef("--pub prints the public key on standard output (it is no secret): redirect it, > FILE, rather than give --out or --force")
	}
	id, err := vlink.ReadIdentityFile(path)
	if err != nil {
		return err
	}
	pub, err := vlink.IdentityPublic(id)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.Stdout, base64.StdEncoding.EncodeToString(pub))
	return err
}

func makeKey(node, keyFile string) ([]byte, error) {
	switch {
	case node == "" && keyFile != "":
		return nil, base.Usagef("--key-file is the network key to derive a node's key from: add --node NAME")
	case node == "":
		b := make([]byte, 32)
		rand.Read(b)
		return base64.StdEncoding.AppendEncode(nil, b), nil
	case !vlink.ValidNodeName(node):
		return nil, base.Usagef("--node %q: %v", node, vlink.ErrBadNodeName)
	case keyFile == "":
		return nil, base.Usagef("--node %s needs the network key to derive from: --key-file NETWORK_KEY", node)
	}
	network, err := vlink.ReadKeyFile(keyFile)
	if err != nil {
		return nil, err
	}
	return vlink.NodeKey(network, node), nil
}

func writeKeyOut(e *base.Env, out string, force bool, key []byte) error {
	line := append(key, '\n')
	if out == "" {
		_, err := e.Stdout.Write(line)
		return err
	}
	return writeFileOut(out, force, 0o600, line)
}

// writeFileOut writes data to a new file of mode perm at path; an
// existing file is an error unless force, which replaces its content
// and sets its mode to perm.
func writeFileOut(path string, force bool, perm os.FileMode, data []byte) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, perm)
	if errors.Is(err, os.ErrExist) {
		return existsError(path)
	}
	if err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil { // an existing file replaced with --force
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func existsError(path string) error {
	return fmt.Errorf("%s exists; keep it, or replace it with --force", path)
}

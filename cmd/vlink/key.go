package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/vlink-dev/vlink/internal/cli"
	"github.com/vlink-dev/vlink/vlink"
)

var keyCmd = &cli.Command{
	Name:     "key",
	Summary:  "make a pre-shared key, or derive a node's key from the network key",
	Synopsis: "[--node NAME --key-file NETWORK_KEY] [--out FILE] [flags]",
	About: `
Without --node, makes a fresh random key (32 random bytes, in base64): the
key of a vlink serve and its tunnels, or the network key of a vlink relay.

With --node, derives from the network key in --key-file the key of the node
called NAME. Give each node only its own key: the relay derives the same key
from the name a node claims, so a node can prove no other node's name. The
network key can act as any node: it belongs on the relay only.

The key goes to standard output, or with --out to a new file of mode 600
(an existing file is left alone unless --force).
`,
	Examples: `
  vlink key --out network.key
  vlink key --node db --key-file network.key --out db.key
`,
	Flags: withEnv(keyFlags),
}

func keyFlags(fs *flag.FlagSet) func(context.Context, *env) int {
	var node, keyFile, out string
	var force bool
	fs.StringVar(&node, "node", "", "derive the key of the node called `NAME` (needs --key-file)")
	fs.StringVar(&keyFile, "key-file", "", "the network key, in `FILE` (mode 600), to derive a node's key from")
	fs.StringVar(&out, "out", "", "write the key to `FILE`, created with mode 600 (default: standard output)")
	fs.BoolVar(&force, "force", false, "let --out replace an existing file")
	return func(ctx context.Context, e *env) int {
		key, err := makeKey(node, keyFile)
		if err == nil {
			err = writeKeyOut(e, out, force, key)
		}
		if err != nil {
			return fail(e, "vlink key", err)
		}
		return exitOK
	}
}

func makeKey(node, keyFile string) ([]byte, error) {
	switch {
	case node == "" && keyFile != "":
		return nil, usagef("--key-file is the network key to derive a node's key from: add --node NAME")
	case node == "":
		b := make([]byte, 32)
		rand.Read(b)
		return base64.StdEncoding.AppendEncode(nil, b), nil
	case !vlink.ValidNodeName(node):
		return nil, usagef("--node %q: %v", node, vlink.ErrBadNodeName)
	case keyFile == "":
		return nil, usagef("--node %s needs the network key to derive from: --key-file NETWORK_KEY", node)
	}
	network, err := vlink.ReadKeyFile(keyFile)
	if err != nil {
		return nil, err
	}
	return vlink.NodeKey(network, node), nil
}

func writeKeyOut(e *env, out string, force bool, key []byte) error {
	line := append(key, '\n')
	if out == "" {
		_, err := e.stdout.Write(line)
		return err
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(out, flags, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists; keep it, or replace it with --force", out)
	}
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil { // an existing file replaced with --force
		f.Close()
		return err
	}
	if _, err := f.Write(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

package base

import (
	"flag"
	"log/slog"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/knownnodes"
)

// noKnownNodes is the --known-nodes value that pins nothing.
const noKnownNodes = "none"

// KnownNodesVar defines the dialing commands' pin file flag.
func KnownNodesVar(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "known-nodes", "", "pin in `FILE` the identity (vlink serve --identity) of each listener reached through an encrypted stack, on first use, and refuse one whose identity changed, as ssh's known_hosts does; none: pin nothing (default: ~/.config/vlink/known_nodes)")
}

// pinFile returns the pin file the --known-nodes value names, which logs
// each key it pins; nil for none.
func pinFile(path string, log *slog.Logger) *knownnodes.File {
	switch path {
	case noKnownNodes:
		return nil
	case "":
		if path = knownnodes.DefaultPath(); path == "" {
			log.Warn("no home folder to keep the pins of listeners' identities in: give --known-nodes FILE")
			return nil
		}
	}
	f := knownnodes.New(path)
	f.Pinned = func(address string, key []byte) {
		log.Info("pinned the identity of a vlink listener, first seen now; it must not change",
			"addr", address, "fingerprint", knownnodes.Fingerprint(key), "file", path)
	}
	return f
}

// SetPins makes the pin file the --known-nodes value names check the
// identities the dialer meets (peerKey) and name the pinned ones in its
// first flights (pinned): a Dialer's or a Config's PeerKey and
// PinnedKey. With none, both are nil.
func SetPins(path string, log *slog.Logger, peerKey *vlink.PeerKeyCallback, pinned *func(string) []byte) {
	*peerKey, *pinned = nil, nil
	if f := pinFile(path, log); f != nil {
		*peerKey, *pinned = f.Check, f.Key
	}
}

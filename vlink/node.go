package vlink

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"

	"github.com/vlink-dev/vlink/internal/nodename"
)

// maxNodeName bounds a node name: one DNS label, so NAME.vlink.alt is a
// valid host name.
const maxNodeName = nodename.MaxLen

// labelNodeKey keeps a node key from ever equalling a proof or another
// derivation of the network key.
const labelNodeKey = "vlink-v1 node key\x00"

// ErrBadNodeName is matched by errors about a node name that is not valid
// (see ValidNodeName).
var ErrBadNodeName = errors.New("invalid node name: want 1..63 lower-case letters, digits and '-', starting with a letter and not ending with '-'")

// NodeKey derives the key of the node called name from the network key:
// HMAC-SHA256(networkKey, "vlink-v1 node key\x00" ‖ name), in base64
// (44 bytes of text), so that it goes in a key file as it is and
// ReadKeyFile gives it back unchanged.
//
// The administrator who holds the network key derives each node's key
// and gives it only to that node, which dials with it (Dialer.Key) and
// its name (Dialer.Node). A listener holding the network key (Policy.Key)
// derives the same key from the name in the hello, so a node can prove
// only its own name. The holder of the network key can act as any node.
func NodeKey(networkKey []byte, name string) []byte {
	m := hmac.New(sha256.New, networkKey)
	m.Write([]byte(labelNodeKey))
	m.Write([]byte(name))
	return base64.StdEncoding.AppendEncode(nil, m.Sum(nil))
}

// ValidNodeName reports whether name can name a node: 1 to 63 bytes of
// lower-case ASCII letters, digits and '-', starting with a letter and not
// ending with '-' (a DNS label).
func ValidNodeName(name string) bool { return nodename.Valid(name) }

package vlink

import (
	"net"
	"strconv"
	"strings"
)

// NodeSuffix ends the host part of an address that names a node of a
// vlink network rather than a host: NODE.vlink.alt:PORT is port PORT on
// the node called NODE, wherever it is and whatever firewall it sits
// behind. ".alt" is the top-level domain RFC 9476 reserves for names
// that are not DNS names, so no DNS name can be taken for a node's.
const NodeSuffix = ".vlink.alt"

// SplitNodeAddr returns the node and the port of an address of the form
// NODE.vlink.alt:PORT, and ok false for any other address.
func SplitNodeAddr(address string) (node string, port uint16, ok bool) {
	host, p, err := net.SplitHostPort(address)
	if err != nil {
		return "", 0, false
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	node, found := strings.CutSuffix(host, NodeSuffix)
	if !found || !ValidNodeName(node) {
		return "", 0, false
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, false
	}
	return node, uint16(n), true
}

// A Vouched connection was set up by a third party both ends trust (the
// relay of a vlink network), which gave each end the other's node name
// and the same fresh key for this connection only. A VLink hello on it
// proves that key, and the encryption layer binds to it, so the two
// nodes authenticate each other end to end without sharing a key of
// their own. package control's Conn is one.
type Vouched interface {
	net.Conn
	// VouchedPeer returns the node at the other end.
	VouchedPeer() string
	// VouchedKey returns the connection's key.
	VouchedKey() []byte
}

// Package rendezvous holds the factories that reach a node of a vlink
// network through the network's relay, the rendezvous where both nodes
// keep a control connection (package vlink/control):
//
//   - reverse: the node dialed connects back to the dialer, through a
//     firewall that blocks every connection into the node; when it
//     cannot, the relay carries the bytes, unless fallback=false.
//   - splice: both nodes connect to each other at the same moment (TCP
//     simultaneous open, timed through the relay), through stateful
//     firewalls on both sides and NATs that keep ports; when it cannot
//     (a NAT that changes ports), the relay carries the bytes, unless
//     fallback=false.
//   - relay: the relay carries the bytes (the last resort, which works
//     wherever both nodes reach the relay).
//
// Without either, a dial to NODE.vlink.alt:PORT takes the best path that
// works. Filters stack above these factories as above any other, and
// run end to end: zstd+relay compresses at the two nodes, and the relay
// carries ciphertext (a vlink.Dialer puts the encryption layer below the
// filters of every dial to a node).
//
// Their forward dialer is the dialer's network (vlink.Dialer.Network),
// which must be a *control.Node; the address must name a node.
//
// Importing the package registers the layers "relay", "reverse" and
// "splice".
package rendezvous

import (
	"context"
	"fmt"
	"net"

	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(directPath("reverse", control.PathReverse,
		"reach a node (NODE.vlink.alt:PORT) by having it connect back to us, through a firewall on its side; needs --reverse-listen",
		"when the node cannot connect back (a firewall on our side too)"))
	layer.Register(directPath("splice", control.PathSplice,
		"reach a node (NODE.vlink.alt:PORT) by both connecting at once (TCP simultaneous open), through firewalls on both sides and NATs that keep ports",
		"when splicing fails (a NAT that changes ports)"))
	layer.Register(layer.Spec{
		Name:     "relay",
		Kind:     layer.KindFactory,
		Terminal: true,
		Nodes:    true,
		Summary:  "reach a node (NODE.vlink.alt:PORT) through the network's relay, which carries the bytes (encrypted end to end)",
		New:      func(layer.Args) (any, error) { return Factory{Paths: control.PathRelay}, nil },
	})
}

// directPath is the spec of a factory that takes one direct path, and
// the relay after it unless fallback=false; fails says when it fails.
func directPath(name string, path control.Paths, summary, fails string) layer.Spec {
	return layer.Spec{
		Name:     name,
		Kind:     layer.KindFactory,
		Terminal: true,
		Nodes:    true,
		Summary:  summary,
		Params: []layer.Param{
			{Name: "fallback", Type: layer.TypeBool, Default: "true", Local: true,
				Doc: fails + ", let the relay carry the bytes; false fails the dial instead"},
		},
		New: func(a layer.Args) (any, error) {
			paths := path
			if a.Bool("fallback") {
				paths |= control.PathRelay
			}
			return Factory{Paths: paths}, nil
		},
	}
}

// A Factory dials a node's port by the paths it allows.
type Factory struct {
	Paths control.Paths
}

var _ layer.Factory = Factory{}

// DialContext connects to address, NODE.vlink.alt:PORT, through forward,
// the network: a *control.Node.
func (f Factory) DialContext(ctx context.Context, network, address string, forward layer.ContextDialer) (net.Conn, error) {
	node, port, ok := vlink.SplitNodeAddr(address)
	if !ok {
		return nil, fmt.Errorf("%s reaches the nodes of a vlink network (NODE%s:PORT), not %s", f.name(), vlink.NodeSuffix, address)
	}
	n, ok := forward.(*control.Node)
	if !ok {
		return nil, fmt.Errorf("%s needs a vlink network to reach %s: a vlink.Dialer whose Network is a *control.Node (vlink --node, --relay), not %T", f.name(), address, forward)
	}
	c, err := n.DialPaths(ctx, node, port, f.Paths)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (f Factory) name() string {
	switch {
	case f.Paths&control.PathReverse != 0:
		return "reverse"
	case f.Paths&control.PathSplice != 0:
		return "splice"
	}
	return "relay"
}

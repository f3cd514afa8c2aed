// Package fwd provides the "fwd" route layer: the connection goes through
// another VLink node, which forwards it (PadicoTM's VLink_fwd). Several fwd
// layers make a chain, the lowest reached first:
//
//	zstd+fwd:via=gw2.example:7000+fwd:via=gw1.example:7000+tcp
//
// reaches gw1 with tcp; gw1 carries the connection on to gw2, reached by
// a way gw1 chooses, and gw2 to the peer. The zstd layer above the routes
// runs between the dialer and the peer only: the nodes on the way carry
// compressed (and, with a key, encrypted) bytes they do not read. Each
// node must allow the next (vlink serve --hop). With nothing to mirror
// and no gateway (Dialer.Via), the topmost node is the gateway that
// forwards to the destination.
//
// The hellos and the policy live in package vlink (see vlink.Policy.Hops
// and vlink.Hello.DialNextHop); this package registers the layer.
package fwd

import (
	"fmt"
	"net"
	"strconv"

	"github.com/vlink-dev/vlink/vlink/layer"
)

func init() {
	layer.Register(layer.Spec{
		Name:    "fwd",
		Kind:    layer.KindRoute,
		Summary: "go through the VLink node at via (vlink serve --hop), which forwards the connection",
		Params: []layer.Param{{Name: "via", Type: layer.TypeString, Required: true,
			Doc: "the node's VLink listener, HOST:PORT, reached through the layers below"}},
		New: func(a layer.Args) (any, error) {
			via := a.String("via")
			if err := checkHostPort(via); err != nil {
				return nil, fmt.Errorf("%w: via %q: %v", layer.ErrBadParam, via, err)
			}
			return Route(via), nil
		},
	})
}

// Route is the fwd layer: the node it goes through. It implements
// layer.Route.
type Route string

var _ layer.Route = Route("")

// Via returns the node's address.
func (r Route) Via() string { return string(r) }

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("empty host")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number in 1..65535", port)
	}
	return nil
}

package vlink

import (
	"context"
	"fmt"
	"net"

	"github.com/vlink-dev/vlink/netconn"
)

// listenQuic takes QUIC connections beside tl, a tcp listener: on the UDP
// port of its number and host (ListenConfig.Quic).
func (lc *ListenConfig) listenQuic(ctx context.Context, stack Stack, tl net.Listener) (net.Listener, error) {
	fail := func(err error) (net.Listener, error) {
		tl.Close()
		return nil, fmt.Errorf("vlink: listen on QUIC: %w", err)
	}
	if len(stack.Layers) != 1 || stack.Layers[0].Name != "tcp" {
		return fail(fmt.Errorf("%w: beside the tcp factory only, not %s", ErrBadStack, stack))
	}
	if lookup("quic") == nil {
		return fail(fmt.Errorf("%w: no quic layer in this program (package factories/quic)", ErrUnknownLayer))
	}
	layer := Layer{Name: "quic"}
	if lc.QuicCert != "" {
		layer.Params = map[string]string{"cert": lc.QuicCert}
	}
	ql, err := ListenStack(ctx, Stack{Layers: []Layer{layer}}, "tcp", tl.Addr().String())
	if err != nil {
		return fail(err)
	}
	lc.logPin(ql)
	return netconn.Merge(tl, ql), nil
}

// logPin logs the key of a listener that has one (QUIC's), for dialers
// to pin.
func (lc *ListenConfig) logPin(l net.Listener) {
	if p, ok := l.(interface{ Pin() string }); ok && lc.Logger != nil {
		lc.Logger.Info("vlink: taking QUIC", "udp", l.Addr().String(), "pin", p.Pin())
	}
}

package layers_test

import (
	"context"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/factories/quic"
	"github.com/vlink-dev/vlink/vlink"
)

// quic is tested on its own transport: the vlink listener wraps a
// QUIC listener, which the stack's quic factory dials.
func init() {
	venues["quic"] = func(t *testing.T) venue {
		t.Cleanup(quic.CloseAll) // the dialers' paths outlive their streams
		return venue{listen: func() (net.Listener, string, error) {
			l, err := vlink.ListenStack(context.Background(), vlink.MustParse("quic"), "tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return l, l.Addr().String(), nil
		}}
	}
}

package layers_test

import (
	"context"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
)

// shm is tested on its own transport: the vlink listener wraps a
// shared-memory listener, which the stack's shm factory dials.
func init() {
	venues["shm"] = func(t *testing.T) venue {
		return venue{listen: func() (net.Listener, string, error) {
			l, err := vlink.ListenStack(context.Background(), vlink.MustParse("shm"), "tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return l, l.Addr().String(), nil
		}}
	}
}

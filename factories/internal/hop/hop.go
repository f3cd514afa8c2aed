// Package hop holds what the proxy factories (socks, http, ssh) share:
// bounding a handshake on a connection by a context, and the error that
// names the hop that failed.
package hop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// Handshake runs f, which talks to a proxy over c, bounded by ctx: the
// context's deadline (or layer.DefaultHandshakeTimeout if it has none)
// becomes c's deadline, and cancelling ctx interrupts f's blocked I/O.
// c's deadline is cleared afterwards. When the context ended the
// handshake, the error matches ctx.Err() as well as f's error.
func Handshake(ctx context.Context, c net.Conn, f func() error) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(layer.DefaultHandshakeTimeout)
	}
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	stop := netconn.InterruptOnDone(ctx, c)
	err := f()
	if !stop() && ctx.Err() != nil {
		if err == nil {
			err = errors.New("interrupted")
		}
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	if err != nil {
		switch {
		case !errors.Is(err, os.ErrDeadlineExceeded):
		case !ok:
			return fmt.Errorf("no answer within %v: %w", layer.DefaultHandshakeTimeout, err)
		case !time.Now().Before(deadline):
			// The context's deadline, enforced through the connection's.
			return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		}
		return err
	}
	return c.SetDeadline(time.Time{})
}

// Addr is a net.Addr for a hop known by its host:port text.
type Addr struct{ Net, Host string }

func (a Addr) Network() string { return a.Net }
func (a Addr) String() string  { return a.Host }

// Error returns the error of a dial through a proxy: a *net.OpError whose
// Net is the layer's name and whose Addr is the proxy (the hop that
// failed), wrapping err. x/net/proxy reports its hops the same way.
func Error(op, layer, proxy string, err error) error {
	return &net.OpError{Op: op, Net: layer, Addr: Addr{"tcp", proxy}, Err: err}
}

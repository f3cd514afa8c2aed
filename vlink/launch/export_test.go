package launch

import (
	"context"
	"net"
)

// OnLocalDial has f called after each of j's dials over shared memory,
// with its error, before Dial goes on.
func OnLocalDial(j *Job, f func(error)) { j.shm = hookedTransport{j.shm, f} }

type hookedTransport struct {
	namedTransport
	after func(error)
}

func (h hookedTransport) DialName(ctx context.Context, name string) (net.Conn, error) {
	c, err := h.namedTransport.DialName(ctx, name)
	h.after(err)
	return c, err
}

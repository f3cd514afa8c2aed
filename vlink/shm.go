package vlink

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// EnvShm says when VLink dials to this machine take shared memory (the
// "shm" layer, factories/shm): auto, on or off. See ShmMode.
const EnvShm = "VLINK_SHM"

// ShmMode says when a VLink dial to a listener on this machine takes
// shared memory instead of loopback TCP. It applies to dials that send
// a hello (a stack with mirrored layers, or a gateway) to a loopback
// address, over the implied tcp factory (a stack that names its
// factories keeps them), and only where the "shm" layer is registered
// (Linux, with package factories/shm imported, as vlink/layers does).
type ShmMode string

const (
	// ShmDefault, the zero value: $VLINK_SHM, else the config's, else
	// ShmAuto.
	ShmDefault ShmMode = ""
	// ShmAuto takes shared memory when the listener offers it (vlink
	// serve --shm: a shared-memory listener of this user on the same
	// port number), and loopback TCP otherwise, or when shared memory
	// fails to set up.
	ShmAuto ShmMode = "auto"
	// ShmOn takes shared memory or fails.
	ShmOn ShmMode = "on"
	// ShmOff never takes it.
	ShmOff ShmMode = "off"
)

// parseShmMode checks a mode given as text (config, environment).
func parseShmMode(s string) (ShmMode, error) {
	switch m := ShmMode(s); m {
	case ShmDefault, ShmAuto, ShmOn, ShmOff:
		return m, nil
	}
	return "", fmt.Errorf("vlink: shm %q: want auto, on or off", s)
}

// shmMode is the mode of d's dials: Dialer.Shm, else $VLINK_SHM, else
// the config's (Dialer.Config, or the default config for a Dialer
// without a stack of its own), else ShmAuto. The environment is on top
// of the config file, as for ConfigFromEnv's other variables.
func (d *Dialer) shmMode() (ShmMode, error) {
	if d.Shm != ShmDefault {
		return parseShmMode(string(d.Shm))
	}
	m, err := parseShmMode(os.Getenv(EnvShm))
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvShm, err)
	}
	if m != ShmDefault {
		return m, nil
	}
	cfg := d.Config
	if cfg == nil && len(d.Stack.Layers) == 0 {
		cfg, _ = DefaultConfig() // its error is the dial's, from route
	}
	if cfg != nil && cfg.Shm != ShmDefault {
		return cfg.Shm, nil
	}
	return ShmAuto, nil
}

// shmTransport is the shm layer with its defaults, if registered.
var shmTransport = sync.OnceValue(func() layer.ContextDialer {
	if lookup("shm") == nil {
		return nil
	}
	t, err := buildTransport([]Layer{{Name: "shm"}})
	if err != nil {
		return nil
	}
	return t
})

// impliedTCP reports whether factories are the tcp factory as the stack
// implies it: no parameters of the user's.
func impliedTCP(factories []Layer) bool {
	return len(factories) == 1 && factories[0].Name == "tcp" && len(factories[0].Params) == 0
}

// localTransport dials shared memory first, then, unless it must, TCP.
type localTransport struct {
	shm, tcp layer.ContextDialer
	must     bool
}

func (t *localTransport) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := t.shm.DialContext(ctx, network, address)
	if err == nil || t.must || ctx.Err() != nil {
		return c, err
	}
	// Not offered (no listener), or shared memory could not be set up:
	// loopback TCP reaches the same listener.
	return t.tcp.DialContext(ctx, network, address)
}

// withShm returns transport, or shared memory before it where mode and
// the dial allow: see ShmMode.
func (r *route) withShm(transport layer.ContextDialer, peer string) (layer.ContextDialer, error) {
	if r.shm == ShmOff || r.transport != nil || !impliedTCP(r.stack.factories()) || !isLoopbackHost(peer) {
		return transport, nil
	}
	shm := shmTransport()
	if shm == nil {
		if r.shm == ShmOn {
			return nil, fmt.Errorf("%w: shared memory (shm) was asked for, and this program has no shm layer (Linux, package factories/shm)", ErrBadStack)
		}
		return transport, nil
	}
	return &localTransport{shm: shm, tcp: transport, must: r.shm == ShmOn}, nil
}

// listenShm adds to tl, a TCP listener of stack, a shared-memory
// listener on its port's number (ListenConfig.Shm).
func listenShm(ctx context.Context, stack Stack, tl net.Listener) (net.Listener, error) {
	fail := func(err error) (net.Listener, error) {
		tl.Close()
		return nil, fmt.Errorf("vlink: listen on shared memory: %w", err)
	}
	if len(stack.Layers) != 1 || stack.Layers[0].Name != "tcp" {
		return fail(fmt.Errorf("%w: beside the tcp factory only, not %s", ErrBadStack, stack))
	}
	if lookup("shm") == nil {
		return fail(fmt.Errorf("%w: no shm layer in this program (Linux, package factories/shm)", ErrUnknownLayer))
	}
	_, port, err := net.SplitHostPort(tl.Addr().String())
	if err != nil {
		return fail(err)
	}
	sl, err := ListenStack(ctx, Stack{Layers: []Layer{{Name: "shm"}}}, "tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		return fail(err)
	}
	return netconn.Merge(tl, sl), nil
}

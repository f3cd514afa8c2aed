//go:build !linux

package lab

import (
	"context"
	"os/exec"
)

type labSys struct{}

// Supported reports ErrUnsupported: the lab needs Linux.
func Supported() error { return ErrUnsupported }

// Programs returns the programs the topology needs on PATH.
func (t *Topology) Programs() []string { return []string{"ip"} }

// Up fails with ErrUnsupported outside Linux.
func Up(ctx context.Context, topo Topology) (*Lab, error) {
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	return nil, ErrUnsupported
}

// List returns no labs outside Linux.
func List() ([]Info, error) { return nil, nil }

// Clean has nothing to clean outside Linux.
func Clean() ([]Info, error) { return nil, nil }

// Remove fails with ErrUnsupported outside Linux.
func Remove(inf Info) error { return ErrUnsupported }

// Ceiling fails with ErrUnsupported outside Linux.
func Ceiling(ctx context.Context, cfg CeilingConfig) ([]Measurement, error) {
	return nil, ErrUnsupported
}

// The methods below are unreachable (Up never returns a Lab here); they
// exist so that code using the lab builds everywhere.

func (l *Lab) Close() error                         { return ErrUnsupported }
func (l *Lab) Stats() []LinkStats                   { return nil }
func (l *Lab) Do(host string, f func() error) error { return ErrUnsupported }
func (l *Lab) Command(host, name string, arg ...string) *exec.Cmd {
	return l.CommandContext(context.Background(), host, name, arg...)
}
func (l *Lab) CommandContext(ctx context.Context, host, name string, arg ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, arg...)
	cmd.Err = ErrUnsupported
	return cmd
}
func (l *Lab) WaitListening(ctx context.Context, host string, port int) error {
	return ErrUnsupported
}
func (l *Lab) SetLink(ctx context.Context, a, b string, ab, ba Shape) error {
	return ErrUnsupported
}
func (l *Lab) Iperf3(ctx context.Context, cfg Iperf3) (Iperf3Result, error) {
	return Iperf3Result{}, ErrUnsupported
}

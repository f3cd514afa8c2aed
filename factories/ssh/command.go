package ssh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// A Command is a command running on the SSH server, as `ssh host
// command` runs it (an exec request, no terminal), on the connection
// the factory shares with its tunnels: vlink launch starts its remote
// workers this way.
type Command struct {
	Stdin  io.WriteCloser
	Stdout io.Reader
	Stderr io.Reader

	s    *session
	sess *gossh.Session
	once sync.Once
}

// Start runs command on the server with the user's login shell. ctx
// bounds the SSH connection's setup and the session's opening, not the
// command.
func (f *Factory) Start(ctx context.Context, command string, forward layer.ContextDialer) (*Command, error) {
	s, err := f.session(ctx, forward)
	if err != nil {
		return nil, hop.Error("start", "ssh", f.t.addr(), err)
	}
	type result struct {
		sess *gossh.Session
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sess, err := s.client.NewSession()
		done <- result{sess, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				r.sess.Close()
			}
			s.release()
		}()
		return nil, hop.Error("start", "ssh", f.t.addr(), ctx.Err())
	}
	c := &Command{s: s, sess: r.sess}
	if r.err == nil {
		c.Stdin, r.err = r.sess.StdinPipe()
	}
	if r.err == nil {
		c.Stdout, r.err = r.sess.StdoutPipe()
	}
	if r.err == nil {
		c.Stderr, r.err = r.sess.StderrPipe()
	}
	if r.err == nil {
		r.err = r.sess.Start(command)
	}
	if r.err != nil {
		c.Close()
		if s.lost() != nil {
			r.err = fmt.Errorf("%w: %w", ErrLost, s.lost())
		}
		return nil, hop.Error("start", "ssh", f.t.addr(), r.err)
	}
	return c, nil
}

// Wait waits for the command to end and for its output to be read. It
// returns nil for exit status 0, a *gossh.ExitError for another status
// or a signal, and an error wrapping ErrLost when the SSH connection
// ended first.
func (c *Command) Wait() error {
	err := c.sess.Wait()
	defer c.Close()
	var ee *gossh.ExitError
	if err != nil && !errors.As(err, &ee) && c.s.lost() != nil {
		return fmt.Errorf("%w: %w", ErrLost, c.s.lost())
	}
	return err
}

// Close ends the session, which ends the command if it still runs (the
// server closes its input and output), and gives back the hold on the
// shared connection.
func (c *Command) Close() error {
	c.once.Do(func() {
		c.sess.Close()
		c.s.release()
	})
	return nil
}

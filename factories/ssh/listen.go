package ssh

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// listener accepts the connections an SSH server forwards from the port
// it listens on for us (tcpip-forward), and asks again on a new SSH
// connection if the old one drops.
type listener struct {
	f       *Factory
	forward layer.ContextDialer
	addr    string // host:port asked for, with the port the server chose

	mu     sync.Mutex
	sess   *session
	inner  net.Listener
	closed chan struct{}
	once   sync.Once
}

func (f *Factory) listen(ctx context.Context, address string, forward layer.ContextDialer) (net.Listener, error) {
	s, inner, err := f.listenOnce(ctx, address, forward)
	if err != nil {
		return nil, hop.Error("listen", "ssh", f.t.addr(), err)
	}
	host, _, _ := net.SplitHostPort(address)
	_, port, _ := net.SplitHostPort(inner.Addr().String())
	return &listener{f: f, forward: forward, addr: net.JoinHostPort(host, port), sess: s, inner: inner, closed: make(chan struct{})}, nil
}

func (f *Factory) listenOnce(ctx context.Context, address string, forward layer.ContextDialer) (*session, net.Listener, error) {
	s, err := f.session(ctx, forward)
	if err != nil {
		return nil, nil, err
	}
	type result struct {
		l   net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := s.client.Listen("tcp", address)
		done <- result{l, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			s.release()
			if s.lost() != nil {
				return nil, nil, fmt.Errorf("%w: %w", ErrLost, s.lost())
			}
			return nil, nil, fmt.Errorf("%w: %s: %w", ErrListenRefused, address, r.err)
		}
		return s, r.l, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.err == nil {
				r.l.Close()
			}
			s.release()
		}()
		return nil, nil, ctx.Err()
	}
}

// Accept waits for a connection the server forwards. While the SSH
// connection is down it keeps trying to make it again, with a backoff of
// up to 30 s, until Close.
func (l *listener) Accept() (net.Conn, error) {
	backoff := time.Duration(0)
	for {
		l.mu.Lock()
		inner, sess := l.inner, l.sess
		l.mu.Unlock()
		if inner != nil {
			c, err := inner.Accept()
			if err == nil {
				// x/crypto/ssh's own conn embeds the channel; give it
				// deadlines and the rest of the contract.
				ch, ok := c.(channel)
				if !ok {
					c.Close()
					continue
				}
				wc := newConn(ch, c.LocalAddr(), c.RemoteAddr(), sess.lost, nil)
				wc.start()
				return wc, nil
			}
			select {
			case <-l.closed:
				return nil, l.opErr(net.ErrClosed)
			default:
			}
			// The SSH connection dropped: forget it, then make it
			// again below.
			l.mu.Lock()
			if l.inner == inner {
				l.inner.Close()
				l.inner = nil
				l.sess.release()
				l.sess = nil
			}
			l.mu.Unlock()
		}
		select {
		case <-l.closed:
			return nil, l.opErr(net.ErrClosed)
		case <-time.After(backoff):
		}
		backoff = min(max(2*backoff, time.Second), 30*time.Second)
		// Close cancels the attempt.
		ctx, cancel := context.WithTimeout(context.Background(), layer.DefaultHandshakeTimeout)
		go func() {
			select {
			case <-l.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		s, in, err := l.f.listenOnce(ctx, l.addr, l.forward)
		cancel()
		if err != nil {
			continue
		}
		l.mu.Lock()
		select {
		case <-l.closed:
			l.mu.Unlock()
			in.Close()
			s.release()
			return nil, l.opErr(net.ErrClosed)
		default:
		}
		l.inner, l.sess = in, s
		l.mu.Unlock()
		backoff = 0
	}
}

func (l *listener) opErr(err error) error {
	return &net.OpError{Op: "accept", Net: "ssh", Addr: l.Addr(), Err: err}
}

// Close stops listening on the server's side and unblocks Accept.
func (l *listener) Close() error {
	err := error(net.ErrClosed)
	l.once.Do(func() {
		err = nil
		close(l.closed)
		l.mu.Lock()
		if l.inner != nil {
			l.inner.Close()
			l.inner = nil
			l.sess.release()
			l.sess = nil
		}
		l.mu.Unlock()
	})
	if err != nil {
		return l.opErr(err)
	}
	return nil
}

// Addr is the address the server listens on, on its side.
func (l *listener) Addr() net.Addr {
	if ta, err := net.ResolveTCPAddr("tcp", l.addr); err == nil {
		return ta
	}
	return hop.Addr{Net: "tcp", Host: l.addr}
}

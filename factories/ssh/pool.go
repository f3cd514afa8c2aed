package ssh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/internal/hop"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// The pool holds the shared SSH connections, by server and path. A
// connection is made by the first dial that needs it, used by every dial
// and listener with the same key, and closed once it has had no user for
// its Persist time, or when it breaks; the next dial makes a new one.
var pool = struct {
	mu    sync.Mutex
	conns map[string]*shared
}{conns: map[string]*shared{}}

// CloseAll closes every SSH connection the package keeps, including those
// tunnelled connections and listeners still use, which then fail. Programs
// call it at shutdown; tests call it to leave no goroutine behind.
func CloseAll() {
	pool.mu.Lock()
	all := make([]*shared, 0, len(pool.conns))
	for _, s := range pool.conns {
		all = append(all, s)
	}
	pool.mu.Unlock()
	for _, s := range all {
		s.closeNow()
	}
}

// Connections returns how many SSH connections are up, for tests and
// diagnostics.
func Connections() int {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	n := 0
	for _, s := range pool.conns {
		s.mu.Lock()
		if s.client != nil {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// shared is one server's connection, up or not.
type shared struct {
	key string
	f   *Factory

	mu         sync.Mutex
	client     *gossh.Client
	tr         *transport
	refs       int
	idle       *time.Timer
	connecting chan struct{} // closed when a connection attempt ends
	connErr    error
}

// A session is one user's hold on a shared connection.
type session struct {
	sh     *shared
	client *gossh.Client
	tr     *transport
	once   sync.Once
}

// release gives the hold back; the last one starts the idle timer.
func (s *session) release() { s.once.Do(func() { s.sh.release(s.client) }) }

// lost returns why the SSH connection ended, or nil while it is up.
func (s *session) lost() error { return s.tr.lost() }

// forwardKey identifies the path to the server: the stack below, as vlink
// describes it, or the dialer itself.
func forwardKey(forward layer.ContextDialer) string {
	switch fw := forward.(type) {
	case nil:
		return "direct"
	case fmt.Stringer:
		return fmt.Sprintf("%T %s", fw, fw.String())
	}
	return fmt.Sprintf("%T %p", forward, forward)
}

// session returns a hold on the shared connection for this factory and
// path, connecting if needed. ctx bounds the connection's setup.
func (f *Factory) session(ctx context.Context, forward layer.ContextDialer) (*session, error) {
	// Jump hosts: the server is reached through an SSH tunnel to each.
	for _, j := range f.t.jumps {
		forward = &jumpDialer{f: j, forward: forward}
	}
	if f.o.NoShare {
		sh := &shared{f: f}
		return sh.acquire(ctx, forward)
	}
	key := fmt.Sprintf("%s|%v|%v|%v|%v|%v|%v|%v|%v|%s", f.t, f.t.identities, f.o.NoAgent, f.o.KnownHosts, f.o.HostKeyCheck,
		f.o.KeepAlive, f.o.Persist, f.o.Ciphers, f.o.ConfigFile, forwardKey(forward))
	pool.mu.Lock()
	sh := pool.conns[key]
	if sh == nil {
		sh = &shared{key: key, f: f}
		pool.conns[key] = sh
	}
	pool.mu.Unlock()
	return sh.acquire(ctx, forward)
}

func (sh *shared) acquire(ctx context.Context, forward layer.ContextDialer) (*session, error) {
	for {
		sh.mu.Lock()
		if sh.client != nil && sh.tr.lost() == nil {
			sh.refs++
			if sh.idle != nil {
				sh.idle.Stop()
				sh.idle = nil
			}
			s := &session{sh: sh, client: sh.client, tr: sh.tr}
			sh.mu.Unlock()
			return s, nil
		}
		if ch := sh.connecting; ch != nil {
			// Another dial is connecting: wait for it rather than
			// making a second connection.
			sh.mu.Unlock()
			select {
			case <-ch:
				sh.mu.Lock()
				err := sh.connErr
				sh.mu.Unlock()
				if err != nil && !(isContextErr(err) && ctx.Err() == nil) {
					return nil, err
				}
				// Up, or the other dial gave up for reasons of its own
				// (its context): look again, and connect if need be.
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		sh.connecting = ch
		sh.mu.Unlock()

		client, tr, err := sh.f.connect(ctx, forward)

		sh.mu.Lock()
		sh.connecting = nil
		sh.connErr = err
		close(ch)
		if err != nil {
			sh.mu.Unlock()
			return nil, err
		}
		if old := sh.client; old != nil {
			old.Close()
		}
		sh.client, sh.tr = client, tr
		sh.refs++
		s := &session{sh: sh, client: client, tr: tr}
		sh.mu.Unlock()
		go sh.watch(client, tr)
		if sh.f.o.KeepAlive > 0 {
			go keepAlive(client, tr, sh.f.o.KeepAlive)
		}
		return s, nil
	}
}

// watch forgets the client once its connection ends, so that the next
// dial makes a new one.
func (sh *shared) watch(client *gossh.Client, tr *transport) {
	err := client.Wait()
	tr.setLost(err)
	tr.Close()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.client != client {
		return
	}
	sh.client, sh.tr = nil, nil
	if sh.idle != nil {
		sh.idle.Stop()
		sh.idle = nil
	}
	// Nobody holds or awaits it: forget the entry, so a long-lived
	// process does not keep one per server it ever reached.
	if sh.key != "" && sh.refs == 0 && sh.connecting == nil && pool.conns[sh.key] == sh {
		delete(pool.conns, sh.key)
	}
}

func (sh *shared) release(client *gossh.Client) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.key == "" { // not shared: the connection is this session's
		client.Close()
		return
	}
	sh.refs--
	if sh.refs > 0 || sh.client != client {
		return
	}
	if sh.f.o.Persist < 0 {
		client.Close()
		return
	}
	if sh.idle != nil {
		sh.idle.Stop()
	}
	sh.idle = time.AfterFunc(sh.f.o.Persist, func() {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if sh.refs == 0 && sh.client == client {
			client.Close()
		}
	})
}

func (sh *shared) closeNow() {
	sh.mu.Lock()
	c := sh.client
	if sh.idle != nil {
		sh.idle.Stop()
		sh.idle = nil
	}
	sh.mu.Unlock()
	if c != nil {
		c.Close()
		c.Wait()
	}
}

// keepAlive sends keepalive@openssh.com requests every interval; if one
// goes unanswered for keepAliveCount intervals, the connection is closed,
// which fails its tunnels and makes the next dial connect again.
func keepAlive(client *gossh.Client, tr *transport, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-tr.done:
			return
		case <-t.C:
		}
		reply := make(chan error, 1)
		go func() {
			_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
			reply <- err
		}()
		timeout := time.NewTimer(interval * keepAliveCount)
		select {
		case <-tr.done:
			timeout.Stop()
			return
		case err := <-reply:
			timeout.Stop()
			if err != nil {
				return // the connection is ending; watch sees it
			}
		case <-timeout.C:
			tr.setLost(fmt.Errorf("no answer to keepalives for %v", interval*keepAliveCount))
			tr.Close()
			return
		}
	}
}

// connect dials the server through forward and runs the SSH handshake.
func (f *Factory) connect(ctx context.Context, forward layer.ContextDialer) (*gossh.Client, *transport, error) {
	if forward == nil {
		forward = &net.Dialer{}
	}
	addr := f.t.addr()
	raw, err := forward.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("reaching the server: %w", err)
	}
	tr := newTransport(raw)
	if len(f.o.Ciphers) > 0 {
		allGCM := true
		for _, c := range f.o.Ciphers {
			allGCM = allGCM && gcmCiphers[c]
		}
		if allGCM {
			tr.framer = &framer{conn: raw}
		}
	}
	hk, err := newHostKeys(f.o.KnownHosts, f.o.HostKeyCheck)
	if err != nil {
		raw.Close()
		return nil, nil, err
	}
	a, err := f.newAuth()
	if err != nil {
		raw.Close()
		return nil, nil, err
	}
	defer a.close()
	var hostKeyOK atomic.Bool
	check := hk.callback(addr)
	cfg := &gossh.ClientConfig{
		User: f.t.user,
		Auth: a.methods,
		HostKeyCallback: func(hostname string, remote net.Addr, key gossh.PublicKey) error {
			err := check(hostname, remote, key)
			hostKeyOK.Store(err == nil)
			return err
		},
		HostKeyAlgorithms: hk.algorithms(addr),
		ClientVersion:     "SSH-2.0-vlink",
	}
	cfg.Ciphers = f.o.Ciphers
	var client *gossh.Client
	err = hop.Handshake(ctx, tr, func() error {
		cc, chans, reqs, err := gossh.NewClientConn(tr, addr, cfg)
		if err != nil {
			return err
		}
		client = gossh.NewClient(cc, chans, reqs)
		return nil
	})
	if err != nil {
		if client != nil {
			client.Close()
		}
		tr.Close()
		var hke *HostKeyError
		switch {
		case errors.As(err, &hke):
			return nil, nil, hke
		case hostKeyOK.Load() && a.started.Load() && tr.failed() == nil && ctx.Err() == nil && !isTimeout(err):
			// The server let us in as far as authentication, and
			// the connection is still up: it turned our keys down.
			return nil, nil, a.error(f.t, err)
		}
		return nil, nil, err
	}
	return client, tr, nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// jumpDialer reaches an address through an SSH server: the hops of
// ProxyJump.
type jumpDialer struct {
	f       *Factory
	forward layer.ContextDialer
}

func (d *jumpDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.f.DialContext(ctx, network, address, d.forward)
}

func (d *jumpDialer) String() string {
	return "ssh:" + d.f.t.String() + "+" + forwardKey(d.forward)
}

package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// Spliced connections: TCP simultaneous open. Each node opens a listener
// on a fresh port, shared (SO_REUSEPORT) with the socket that will
// connect from it; the relay tells each the other's port at the address
// it saw it come from. Then both connect to each other at about the same
// moment:
//
//	A -> relay -> B: dial/offer, with flagSplice and A's port
//	B -> relay -> A: punch{token, B's port}     A measures the round trip T
//	A -> relay -> B: sync{token}                A waits T/2, then connects;
//	                                            B connects on the sync
//
// A stateful firewall (or a NAT that keeps ports) on either side lets
// in the other's SYN once its own node's SYN went out, since it is then
// the reply of a connection it saw start; a SYN that comes too early is
// dropped and the other's gets through. Both SYNs crossing make one TCP
// connection (simultaneous open); where nothing filters, one side's
// listener takes the other's connection instead. Either way there is
// one connection, and the roles come from the rendezvous, not from who
// connected: B sends attach{token} on it as on a reverse connection and
// A, which knows its own tokens (each used once), answers attached.
//
// A NAT that picks a new port for every destination defeats it: the
// port the relay saw is not the one the other node's SYN must reach.
// A node finds that out from its own control connection (it left from
// one port, the relay saw another) and does not try.

// ErrNATChangesPorts is matched by the error of a splice that cannot work
// because this node is behind a NAT (or a proxy) that changes ports.
var ErrNATChangesPorts = errors.New("control: behind a NAT or proxy that changes ports, which TCP simultaneous open cannot cross")

// Timing of a splice.
const (
	// spliceTimeout bounds each side's wait for the other's step (the
	// punch, the sync) and then the connecting: a path that cannot be
	// spliced costs at most about twice this.
	spliceTimeout = 3 * time.Second
	// minRetryGap is the least pause between two connects after a
	// refusal: the other side is not connecting yet, or a host on the
	// way answered for it.
	minRetryGap = 20 * time.Millisecond
)

// spliceCheck says why this node cannot splice, or nil: it compares the
// port its control connection left from with the port the relay saw.
func (n *Node) spliceCheck() error {
	if !spliceSupported {
		return errors.New("control: splicing needs SO_REUSEPORT, which this system lacks")
	}
	n.mu.Lock()
	observed, local := n.observed, n.local
	n.mu.Unlock()
	switch {
	case !observed.IsValid():
		return errors.New("control: the relay has not said where it sees this node")
	case !local.IsValid() || observed.Addr() == local.Addr() || observed.Port() == local.Port():
		return nil // no NAT, or one that keeps ports
	}
	return fmt.Errorf("%w (the control connection left from port %d; the relay saw %s)", ErrNATChangesPorts, local.Port(), observed)
}

// spliceListen opens the listener a splice connects from and accepts
// on: a fresh port, shared with the connecting socket, in the address
// family the relay sees this node in.
func (n *Node) spliceListen(ctx context.Context) (*net.TCPListener, error) {
	n.mu.Lock()
	observed := n.observed
	n.mu.Unlock()
	network, any := "tcp4", "0.0.0.0:0"
	if observed.Addr().Is6() {
		network, any = "tcp6", "[::]:0"
	}
	lc := net.ListenConfig{Control: reusePort}
	l, err := lc.Listen(ctx, network, any)
	if err != nil {
		return nil, fmt.Errorf("control: a port to splice from: %w", err)
	}
	return l.(*net.TCPListener), nil
}

// spliceFrom is A's side once B's punch arrived: connect after delay,
// and hand the connection, once B proved the token on it, to the dial
// waiting for it.
func (n *Node) spliceFrom(ctx context.Context, l *net.TCPListener, peer netip.AddrPort, delay time.Duration) {
	c, err := punchThrough(ctx, l, peer, delay)
	if err != nil {
		n.log.Debug("control: splice failed", "to", peer.String(), "err", err)
		return
	}
	n.takeReverse(c, "splice")
}

// spliceTo is B's side of an offer with flagSplice: open a port, tell A
// through the relay, wait for A's sync and for hold to return, connect,
// and prove the token.
func (n *Node) spliceTo(ctx context.Context, ch *channel, f *frame, hold func()) (net.Conn, error) {
	if err := n.spliceCheck(); err != nil {
		return nil, err
	}
	if f.splice.Addr().Is4() != n.Observed().Addr().Is4() {
		return nil, fmt.Errorf("control: %s is at %s, in another address family than this node", f.name, f.splice)
	}
	l, err := n.spliceListen(ctx)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	synced := make(chan struct{}, 1)
	n.mu.Lock()
	n.syncs[f.token] = synced
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.syncs, f.token)
		n.mu.Unlock()
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	if err := ch.trySend(&frame{op: opPunch, token: f.token, splice: netip.AddrPortFrom(netip.IPv4Unspecified(), port)}); err != nil {
		return nil, err
	}
	t := time.NewTimer(spliceTimeout)
	defer t.Stop()
	select {
	case <-synced:
	case <-t.C:
		return nil, fmt.Errorf("control: %s did not answer the punch within %v", f.name, spliceTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	hold()
	c, err := punchThrough(ctx, l, f.splice, 0)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, reverseTimeout)
	defer cancel()
	if err := attachOn(ctx, c, f.token); err != nil {
		c.Close()
		return nil, fmt.Errorf("control: attach on the spliced connection: %w", err)
	}
	return c, nil
}

// synced hands A's sync to the splice waiting for it.
func (n *Node) synced(f *frame) {
	n.mu.Lock()
	ch := n.syncs[f.token]
	n.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// punchThrough makes the one TCP connection between l's port and peer:
// it connects from l's port to peer (after delay, and again after each
// refusal) while l accepts from peer, and returns whichever completes
// first, within spliceTimeout.
func punchThrough(parent context.Context, l *net.TCPListener, peer netip.AddrPort, delay time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(parent, spliceTimeout)
	defer cancel()
	local := l.Addr().(*net.TCPAddr)
	won := make(chan net.Conn, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the other side's connection, if it reaches our listener
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok && unmap(ra.AddrPort()) == peer {
				won <- c
				return
			}
			c.Close() // anyone else
		}
	}()
	var lastErr error
	go func() {
		defer wg.Done()
		if !sleep(ctx, delay) {
			return
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local.IP, Port: local.Port}, Control: reusePort}
		for {
			start := time.Now()
			c, err := d.DialContext(ctx, "tcp", peer.String())
			if err == nil {
				won <- c
				return
			}
			lastErr = err
			// Refused: the other side is not connecting yet. In use: our
			// listener took its connection, on this very pair of ports.
			gap := max(minRetryGap, time.Since(start))
			if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
				gap = max(gap, 100*time.Millisecond) // unreachable and the like: slower
			}
			if !sleep(ctx, gap) {
				return
			}
		}
	}()
	var c net.Conn
	select {
	case c = <-won:
	case <-ctx.Done():
	}
	cancel()
	l.Close()
	wg.Wait()
	close(won)
	for extra := range won {
		if c == nil {
			c = extra
		} else {
			extra.Close()
		}
	}
	if c == nil {
		if parent.Err() != nil {
			return nil, parent.Err() // given up on, not failed
		}
		if lastErr == nil {
			lastErr = ctx.Err()
		}
		return nil, fmt.Errorf("control: no connection with %s within %v: %w", peer, spliceTimeout, lastErr)
	}
	return c, nil
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

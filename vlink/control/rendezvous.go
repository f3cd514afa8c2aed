package control

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// Relayed connections, the last resort when neither node can reach the
// other: both open a connection of their own to the relay, which pairs
// them by a one-time token and copies bytes between them.
//
//	A -> relay (control): dial{coop, token, key, flags, B, port, A's reverse ports}
//	relay -> B (control): offer{token, key, flags, A, port, where A accepts}
//	B -> relay (new connection): attach{token}     or, on B's control: decline{token, reason}
//	relay -> A (control): ready{coop, token, key}  or error{coop, refused, reason}
//	A -> relay (new connection): attach{token}
//	relay -> both: attached; then raw bytes, copied by the kernel (zero-copy)
//
// B races that with the direct paths, which it starts first: if A accepts
// reverse connections (Node.ServeReverse), B connects back to A itself,
// at the address the relay saw A come from, and sends attach{token}; if
// A's dial offers splicing, both connect at once (splice.go) and B sends
// attach{token} on that. B attaches to the relay only relayStagger later,
// or once the direct paths failed, and never if A's dial forbade the
// relay (flagNoRelay): then B declines as unreachable, and the relay
// takes no attach for that token. A decides: it answers attached on the
// one connection it takes, and if that is a direct one, tells the relay
// (decline, direct), which drops the set-up and B's connection to it.
//
// The token (A's, random) is single use, bound to both nodes' names at
// the relay (each attach comes on a connection whose hello proved its
// node; a reverse attach reaches only A, which knows its own tokens) and
// expires with RendezvousTimeout. The key is fresh per connection, made
// by A, and crosses only the nodes' encrypted control channels: the
// nodes' hello and encryption run end to end with it, so the relay
// carries ciphertext. The relay sees the key, so it is trusted not to read
// along, as the holder of the network key is trusted with every name.

// Defaults of RelayConfig's rendezvous limits.
const (
	// RendezvousTimeout bounds a relayed connection's set-up, from the
	// dial to both ends attached.
	RendezvousTimeout = 10 * time.Second
	DefaultMaxRelayed = 1024
	// maxPendingPerNode bounds the set-ups one node can have open, so a
	// node cannot fill the relay's table.
	maxPendingPerNode = 64
)

// rendezvous is a relayed connection being set up.
type rendezvous struct {
	token  [tokenSize]byte
	key    []byte
	a, b   *peer // the dialer and the node it asked for
	coop   uint64
	port   uint16
	flags  uint8
	bConn  net.Conn // B's data connection, once attached
	expiry *time.Timer
	// punched and synced: B's punch and A's sync went through; each
	// passes once.
	punched, synced bool
}

// dial handles A's request for a relayed connection to f.name's port.
func (r *Relay) dial(a *peer, f *frame) {
	refuse := func(code Code, reason string) {
		r.refused[code].Add(1)
		a.send(&frame{op: opError, coop: f.coop, code: code, name: f.name, reason: reason})
	}
	b := r.lookup(f.name)
	if b == nil {
		refuse(CodeNoNode, "")
		return
	}
	rv := &rendezvous{a: a, b: b, coop: f.coop, port: f.port, flags: f.flags, token: f.token, key: f.key}
	r.mu.Lock()
	switch {
	case r.pending[f.token] != nil:
		r.mu.Unlock()
		refuse(CodeBusy, "a connection with that token is being set up")
		return
	case a.pending >= maxPendingPerNode:
		r.mu.Unlock()
		refuse(CodeBusy, fmt.Sprintf("%d connections of this node are being set up already", maxPendingPerNode))
		return
	case len(r.pending)+int(r.relayed.Load()) >= r.cfg.MaxRelayed:
		r.mu.Unlock()
		refuse(CodeBusy, "the relay sets up as many connections as it takes")
		return
	}
	a.pending++
	r.pending[rv.token] = rv
	rv.expiry = time.AfterFunc(RendezvousTimeout, func() {
		if r.take(rv.token) != nil {
			if rv.bConn != nil {
				r.drop(rv.bConn)
			}
			refuse(CodeTimeout, fmt.Sprintf("no answer within %v", RendezvousTimeout))
		}
	})
	r.mu.Unlock()
	offer := &frame{op: opOffer, token: rv.token, key: rv.key, flags: rv.flags, name: a.name, port: f.port, addrs: reverseAddrs(a, f.addrs)}
	if offer.flags&flagSplice != 0 {
		if offer.splice = observedAt(a, f.splice.Port()); !offer.splice.IsValid() {
			offer.flags &^= flagSplice
		}
	}
	if err := b.send(offer); err != nil {
		r.take(rv.token)
		refuse(CodeBusy, "its queue is full")
	}
}

// reverseAddrs returns where B may connect back to A: the ports A
// accepts reverse connections on, at the address the relay saw A connect
// from. Never an address A names itself: a node cannot send another to
// connect to a third host.
func reverseAddrs(a *peer, asked []netip.AddrPort) []netip.AddrPort {
	if !a.observed.IsValid() || a.observed.Addr().IsUnspecified() {
		return nil
	}
	var out []netip.AddrPort
	for _, x := range asked {
		ap := netip.AddrPortFrom(a.observed.Addr(), x.Port())
		if !slices.Contains(out, ap) {
			out = append(out, ap)
		}
	}
	return out
}

// observedAt returns port at the address p was seen connecting from, or
// the zero AddrPort if p was seen from none.
func observedAt(p *peer, port uint16) netip.AddrPort {
	if !p.observed.IsValid() || p.observed.Addr().IsUnspecified() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(p.observed.Addr(), port)
}

// punch passes B's splice address on to A, once per rendezvous whose
// dial offered splicing; the IP is the one the relay saw B come from.
func (r *Relay) punch(b *peer, f *frame) {
	r.mu.Lock()
	rv := r.pending[f.token]
	ok := rv != nil && rv.b == b && rv.flags&flagSplice != 0 && !rv.punched
	if ok {
		rv.punched = true
	}
	r.mu.Unlock()
	if !ok {
		if rv == nil && b.via == nil {
			r.passBack(b, f) // another relay's, perhaps
		}
		return
	}
	if at := observedAt(b, f.splice.Port()); at.IsValid() {
		rv.a.send(&frame{op: opPunch, token: f.token, splice: at})
	}
}

// sync passes A's signal to connect on to B, once per punched rendezvous.
func (r *Relay) sync(a *peer, f *frame) {
	r.mu.Lock()
	rv := r.pending[f.token]
	ok := rv != nil && rv.a == a && rv.punched && !rv.synced
	if ok {
		rv.synced = true
	}
	r.mu.Unlock()
	if ok {
		rv.b.send(&frame{op: opSync, token: f.token})
	}
}

// take removes a rendezvous from the table and returns it, or nil if it
// is gone (taken, expired).
func (r *Relay) take(token [tokenSize]byte) *rendezvous {
	r.mu.Lock()
	defer r.mu.Unlock()
	rv := r.pending[token]
	if rv == nil {
		return nil
	}
	delete(r.pending, token)
	rv.a.pending--
	rv.expiry.Stop()
	return rv
}

// decline handles a node's word on a rendezvous: from B, its refusal of
// the offer; from either, codeDirect: the nodes connected by themselves,
// and the relay drops the set-up, and B's data connection if it came.
func (r *Relay) decline(p *peer, f *frame) {
	r.mu.Lock()
	rv := r.pending[f.token]
	var bConn net.Conn
	if rv != nil {
		bConn = rv.bConn
	}
	r.mu.Unlock()
	switch {
	case rv == nil:
		// Expired, taken, never was, or another relay's.
		if p.via == nil {
			r.passBack(p, f)
		}
	case f.code == codeDirect && (p == rv.a || p == rv.b):
		if r.take(f.token) != nil && bConn != nil {
			r.drop(bConn)
		}
	case p == rv.b && bConn == nil:
		if r.take(f.token) != nil {
			rv.a.send(&frame{op: opError, coop: rv.coop, code: f.code, name: p.name, reason: f.reason})
		}
	}
}

// attach handles a data connection from the node name: B's first, which
// tells A to come, then A's, which completes the pair.
func (r *Relay) attach(c net.Conn, name string, token [tokenSize]byte) {
	r.mu.Lock()
	rv := r.pending[token]
	switch {
	case rv == nil:
		r.mu.Unlock()
		if r.bridge(c, token) {
			return // the half of a connection another relay sets up
		}
		r.log.Info("control: relay: attach with an unknown or used token", "node", name)
		r.drop(c)
		return
	case rv.flags&flagNoRelay != 0:
		r.mu.Unlock()
		r.log.Info("control: relay: attach for a connection its dialer keeps off the relay", "node", name)
		r.drop(c)
		return
	// An end that proved no name (name "", a member's: see
	// RelayConfig.Member) is the one the token expects next.
	case rv.bConn == nil && (rv.b.name == name || name == ""):
		rv.bConn = c
		r.mu.Unlock()
		if err := rv.a.send(&frame{op: opReady, coop: rv.coop, token: token, key: rv.key}); err != nil {
			if r.take(token) != nil {
				r.drop(c)
			}
		}
		return
	case rv.bConn != nil && (rv.a.name == name || name == ""):
		r.mu.Unlock()
		if r.take(token) == nil {
			r.drop(c) // expired meanwhile
			return
		}
	default:
		r.mu.Unlock()
		r.log.Info("control: relay: attach with a token bound to other nodes", "node", name)
		r.drop(c)
		return
	}
	// Both ends are here.
	defer r.untrack(rv.bConn)
	defer r.untrack(c)
	attached := (&frame{op: opAttached}).append(nil)
	c.SetWriteDeadline(time.Now().Add(writeTimeout))
	rv.bConn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, errA := c.Write(attached)
	_, errB := rv.bConn.Write(attached)
	if errA != nil || errB != nil {
		netconn.Abort(c)
		netconn.Abort(rv.bConn)
		return
	}
	c.SetDeadline(time.Time{})
	rv.bConn.SetDeadline(time.Time{})
	r.log.Debug("control: relay: relaying", "from", rv.a.name, "to", rv.b.name, "port", rv.port)
	r.relayed.Add(1)
	r.relayedTotal.Add(1)
	defer r.relayed.Add(-1)
	aToB, bToA, err := netconn.Relay(c, rv.bConn)
	r.relayedBytes.Add(uint64(aToB + bToA))
	r.log.Debug("control: relay: relayed", "from", rv.a.name, "to", rv.b.name, "port", rv.port, "sent", aToB, "received", bToA, "err", err)
}

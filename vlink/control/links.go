package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// Relays of one network link with each other (RelayConfig.Peers), so
// that a node registered with one reaches a node registered with
// another. Each pair keeps one link: a control connection between the
// relays, encrypted and authenticated by their certificates (the owner
// signed each for a relay), over which each announces the nodes
// registered with it and passes on what concerns them:
//
//	either relay, first: link{the ports it takes connections on}
//	R2 -> R1: joined{b, where R2 sees b}      left{b}
//	R1 -> R2: via{b, frame}    a frame R1 would send b, were b registered with it
//	R2 -> R1: from{b, frame}   b's punch or decline for a connection R1 sets up
//
// A relay passes on only what it would send or take itself: R1 sets up
// a's connection to b (the relay of the node that dials owns the
// rendezvous), and R2 is b's end of it: it passes R1's offer, sync and
// errors to b, b's punch and decline to R1 and, when b attaches for the
// relayed path, opens a connection of its own to R1 that attaches with
// the same token, and copies bytes between the two:
//
//	a <-> R1 <-> R2 <-> b
//
// The nodes' encryption runs end to end inside it: neither relay holds
// a key that opens the stream. Nodes hold certificates, so a relay
// cannot register a name for another key; what a relay must be trusted
// with is what it says about the nodes registered with it, as a node's
// own relay is.
//
// Announcements reach only the relays linked directly: the relays of a
// network link in a full mesh (each lists the others, or is listed by
// them). Where two relays list each other, both dial, and both keep the
// link the relay with the smaller name dialed.

// linkQueue bounds the bytes queued toward another relay: the whole
// directory goes out when a link comes up (some tens of bytes a node).
const linkQueue = 16 << 20

// A link is this relay's end of the link with another relay.
type link struct {
	name   string // the other relay's certificate name
	cert   *nodecert.Certificate
	ch     *channel
	dialed bool   // this relay dialed it
	data   string // where to open a relayed connection's half at the other relay
	// remote are the nodes registered with the other relay, as it
	// announced them; under Relay.mu.
	remote map[string]*peer
}

// A transit is a connection another relay sets up to a node registered
// here: this relay passes on the node's part, and carries its relayed
// half.
type transit struct {
	via    *link
	b      *peer
	expiry *time.Timer
}

// errDuplicateLink ends the second link between two relays.
var errDuplicateLink = errors.New("control: relay: another link with that relay is up")

// linkDialer returns the dialer a relay reaches another with: its
// certificate, proved in the encryption layer, taking only a relay's
// certificate of the same owner, whose name it reports.
func (r *Relay) linkDialer(got **nodecert.Certificate) *vlink.Dialer {
	own := r.cfg.Member.Cert
	return &vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Member: r.cfg.Member,
		PeerCert: func(address string, c *nodecert.Certificate) error {
			if err := relayOnly(address, c); err != nil {
				return err
			}
			if bytes.Equal(c.PublicKey(), own.PublicKey()) || c.Name() == own.Name() {
				return fmt.Errorf("%w: %s is this relay itself (%s)", vlink.ErrAuth, address, c.Name())
			}
			*got = c
			return nil
		}}
}

// keepLinked keeps a link with the relay at addr until the relay
// closes, dialing again with backoff when it fails.
func (r *Relay) keepLinked(addr string) {
	defer r.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		var cert *nodecert.Certificate
		ctx, cancel := context.WithTimeout(r.ctx, vlink.DefaultHandshakeTimeout)
		c, err := r.linkDialer(&cert).DialContext(ctx, "tcp", addr)
		cancel()
		start := time.Now()
		var name string
		if err == nil {
			name = cert.Name()
			err = r.serveLink(c, cert, addr)
		}
		if r.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errDuplicateLink) {
			// The other relay's dial won: wait while it lives.
			for r.linked(name) {
				if !sleep(r.ctx, time.Second) {
					return
				}
			}
			backoff = 100 * time.Millisecond
		} else {
			r.log.Warn("control: relay: link with another relay failed; dialing again", "relay", addr, "err", err, "retry in", backoff)
		}
		if time.Since(start) > maxBackoff {
			backoff = 100 * time.Millisecond // it was up for a while
		}
		if !sleep(r.ctx, jitter(backoff)) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (r *Relay) linked(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.links[name] != nil
}

// serveLink runs the link on c with the relay cert names until it ends;
// addr is where this relay dialed it, "" if the other relay did.
func (r *Relay) serveLink(c net.Conn, cert *nodecert.Certificate, addr string) error {
	name := cert.Name()
	if !r.track(c) {
		c.Close()
		return net.ErrClosed
	}
	defer r.untrack(c)
	ch := newChannel(c, linkQueue, &r.budget)
	// The dialer speaks first: a certificate that opens otherwise is
	// no relay's link, and learns nothing.
	if addr != "" {
		ch.trySend(&frame{op: opLink, addrs: r.listenPorts()})
	}
	c.SetReadDeadline(time.Now().Add(vlink.DefaultHandshakeTimeout))
	f, err := readFrame(c)
	if err == nil && f.op != opLink {
		err = fmt.Errorf("%w: a relay opens a link with link, not %s", ErrMalformed, f.op)
	}
	if addr == "" {
		if err != nil {
			reason := LoginMalformed
			if !errors.Is(err, ErrMalformed) {
				reason = LoginFailed
			}
			if f != nil && f.op == opAdvertise {
				reason = LoginRefused
				err = fmt.Errorf("the certificate of %s is a relay's, which registers no node", name)
			}
			r.logins.log.Info("control: relay: no link", "relay", name, "remote", c.RemoteAddr().String(), "reason", reason, "err", err)
			r.logins.failed(reason)
			ch.fail(err)
			return err
		}
		ch.trySend(&frame{op: opLink, addrs: r.listenPorts()})
	}
	l := &link{name: name, cert: cert, ch: ch, dialed: addr != "", data: addr, remote: map[string]*peer{}}
	if err == nil && addr == "" {
		// Its relayed halves go where it listens, at the address it
		// came from.
		ta, _ := c.RemoteAddr().(*net.TCPAddr)
		if ta == nil || len(f.addrs) == 0 {
			err = fmt.Errorf("%w: the relay %s names no port it takes connections on", ErrMalformed, name)
		} else {
			l.data = netip.AddrPortFrom(unmap(ta.AddrPort()).Addr(), f.addrs[0].Port()).String()
		}
	}
	if err == nil {
		err = r.addLink(l)
	}
	if err != nil {
		ch.fail(err)
		return err
	}
	r.log.Info("control: relay: linked with another relay", "relay", name, "dialed", l.dialed, "data", l.data)
	defer r.dropLink(l)
	stop := make(chan struct{})
	defer close(stop)
	go r.pingLink(l, stop)
	for {
		c.SetReadDeadline(time.Now().Add(r.cfg.IdleTimeout))
		f, err := readFrame(c)
		if err == nil {
			err = r.handleLink(l, f)
		}
		if err != nil {
			if cerr := ch.Err(); cerr != nil {
				err = cerr
			}
			ch.fail(err)
			r.log.Info("control: relay: link with another relay ended", "relay", name, "err", err)
			return err
		}
	}
}

// pingLink keeps a link alive, as nodes keep theirs: four silent
// intervals end it at the other end.
func (r *Relay) pingLink(l *link, stop <-chan struct{}) {
	t := time.NewTicker(r.cfg.IdleTimeout / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			l.ch.trySend(&frame{op: opPing, payload: make([]byte, pingSize)})
		case <-stop:
			return
		}
	}
}

// listenPorts returns the ports the relay takes connections on.
func (r *Relay) listenPorts() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []netip.AddrPort
	for l := range r.listeners {
		if ta, ok := l.Addr().(*net.TCPAddr); ok && len(out) < maxAddrs {
			out = append(out, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(ta.Port)))
		}
	}
	return out
}

// addLink installs l, keeping one link per relay, and queues this
// relay's directory on it: under r.mu, as every announcement, so that
// none overtakes another.
func (r *Relay) addLink(l *link) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return net.ErrClosed
	}
	if old := r.links[l.name]; old != nil {
		// A reconnect replaces the link it beat; of two dialed each
		// way, both relays keep the one the smaller name dialed.
		if old.dialed != l.dialed && l.dialed != (r.cfg.Member.Cert.Name() < l.name) {
			return errDuplicateLink
		}
		old.ch.fail(errDuplicateLink)
	}
	r.links[l.name] = l
	for _, p := range r.nodes {
		if err := l.ch.trySend(joined(p)); err != nil {
			return fmt.Errorf("control: relay: the directory does not fit the link's queue: %w", err)
		}
	}
	return nil
}

// joined returns the announcement of the local node p.
func joined(p *peer) *frame {
	observed := p.observed
	if !observed.IsValid() {
		observed = netip.AddrPortFrom(netip.IPv6Unspecified(), 1)
	}
	p.mu.Lock()
	addrs := append([]netip.AddrPort{observed}, p.advertised...)
	p.mu.Unlock()
	return &frame{op: opJoined, name: p.name, addrs: addrs[:min(len(addrs), maxAddrs)]}
}

// announce sends f to every linked relay; r.mu is held. A link whose
// queue is full ends: its relay gets the whole directory again when it
// comes back, rather than a directory with a hole.
func (r *Relay) announce(f *frame) {
	for _, l := range r.links {
		if err := l.ch.trySend(f); err != nil {
			l.ch.fail(fmt.Errorf("control: relay: link queue full: %w", err))
		}
	}
}

// dropLink forgets a link that ended, the nodes it announced and the
// connections it was setting up.
func (r *Relay) dropLink(l *link) {
	r.mu.Lock()
	if r.links[l.name] == l {
		delete(r.links, l.name)
	}
	var gone []*peer
	for name, p := range l.remote {
		r.forgetRemote(name, p)
		gone = append(gone, p)
	}
	for token, t := range r.transit {
		if t.via == l {
			t.expiry.Stop()
			delete(r.transit, token)
		}
	}
	r.mu.Unlock()
	for _, p := range gone {
		r.unregister(p)
	}
}

// forgetRemote removes the remote node p from the directory, falling
// back on another relay's announcement of the same name; r.mu is held.
func (r *Relay) forgetRemote(name string, p *peer) {
	delete(p.via.remote, name)
	if r.remote[name] != p {
		return
	}
	delete(r.remote, name)
	for _, l := range r.links {
		if q := l.remote[name]; q != nil {
			r.remote[name] = q
			return
		}
	}
}

// handleLink acts on one frame from another relay. An error ends the
// link: only a frame no relay sends does that.
func (r *Relay) handleLink(l *link, f *frame) error {
	switch f.op {
	case opPing:
		l.ch.trySend(&frame{op: opPong, payload: f.payload})
	case opPong:
	case opJoined:
		if len(f.addrs) == 0 {
			return fmt.Errorf("%w: joined without the address the relay sees %s at", ErrMalformed, f.name)
		}
		p := &peer{name: f.name, via: l, since: time.Now(), advertised: f.addrs[1:]}
		if o := f.addrs[0]; !o.Addr().IsUnspecified() {
			p.observed = o
		}
		r.mu.Lock()
		old := l.remote[f.name]
		if old == nil && len(l.remote) >= r.cfg.MaxNodes {
			r.mu.Unlock()
			return fmt.Errorf("control: relay: relay %s announced more than %d nodes, the most this relay takes", l.name, r.cfg.MaxNodes)
		}
		if old != nil && old.observed == p.observed {
			// The same registration, with new addresses.
			old.mu.Lock()
			old.advertised = p.advertised
			old.mu.Unlock()
			r.mu.Unlock()
			return nil
		}
		l.remote[f.name] = p
		if r.remote[f.name] == nil || r.remote[f.name] == old {
			r.remote[f.name] = p
		}
		r.mu.Unlock()
		if old != nil {
			r.unregister(old)
		}
	case opLeft:
		r.mu.Lock()
		p := l.remote[f.name]
		if p != nil {
			r.forgetRemote(f.name, p)
		}
		r.mu.Unlock()
		if p != nil {
			r.unregister(p)
		}
	case opVia:
		in, err := f.unwrap()
		if err != nil {
			return err
		}
		r.passOn(l, f.name, in)
	case opFrom:
		in, err := f.unwrap()
		if err != nil {
			return err
		}
		r.mu.Lock()
		p := l.remote[f.name]
		r.mu.Unlock()
		if p == nil {
			return nil // gone meanwhile
		}
		switch in.op {
		case opPunch:
			r.punch(p, in)
		case opDecline:
			r.decline(p, in)
		}
	default:
		return fmt.Errorf("%w: a relay does not send %s on a link", ErrMalformed, f.op)
	}
	return nil
}

// passOn delivers the frame another relay sent for the node name,
// registered here, or tells that relay it could not.
func (r *Relay) passOn(l *link, name string, f *frame) {
	q := r.local(name)
	decline := func(code Code, reason string) {
		l.ch.trySend(&frame{op: opFrom, name: name, payload: (&frame{op: opDecline, token: f.token, code: code, reason: reason}).append(nil)})
	}
	if f.op == opOffer {
		switch {
		case q == nil:
			decline(CodeNoNode, "it went offline")
			return
		case !r.addTransit(l, q, f.token):
			decline(CodeBusy, "the relay it is registered with sets up as many connections as it takes")
			return
		}
		if err := q.ch.trySend(f); err != nil {
			r.passBack(q, &frame{op: opDecline, token: f.token, code: CodeBusy, reason: "its queue is full"})
		}
		return
	}
	if q == nil {
		return // what waits for it learns from opLeft, or times out
	}
	if f.op == opDeliver && f.coop != 0 {
		q.vouch(f.name, f.coop)
	}
	if err := q.ch.trySend(f); err != nil && f.op == opDeliver && f.coop != 0 {
		sender := f.name
		if f.name2 != "" {
			sender = f.name2
		}
		if s := r.lookup(sender); s != nil {
			r.refused[CodeBusy].Add(1)
			s.send(&frame{op: opError, coop: f.coop, code: CodeBusy, name: name, reason: "its queue is full"})
		}
	}
}

// local returns the node registered here under name, or nil.
func (r *Relay) local(name string) *peer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[name]
}

// addTransit records that the local node b was offered a connection
// another relay sets up, so that b's answers go there.
func (r *Relay) addTransit(l *link, b *peer, token [tokenSize]byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.transit[token] != nil || len(r.transit)+len(r.pending)+int(r.relayed.Load()) >= r.cfg.MaxRelayed {
		return false
	}
	t := &transit{via: l, b: b}
	t.expiry = time.AfterFunc(RendezvousTimeout, func() {
		r.mu.Lock()
		if r.transit[token] == t {
			delete(r.transit, token)
		}
		r.mu.Unlock()
	})
	r.transit[token] = t
	return true
}

// passBack sends the local node b's punch or decline for a connection
// another relay sets up to that relay, and reports whether the token was
// one.
func (r *Relay) passBack(b *peer, f *frame) bool {
	r.mu.Lock()
	t := r.transit[f.token]
	ok := t != nil && t.b == b
	if ok && f.op == opDecline {
		t.expiry.Stop()
		delete(r.transit, f.token)
	}
	r.mu.Unlock()
	if ok {
		t.via.ch.trySend(&frame{op: opFrom, name: b.name, payload: f.append(nil)})
	}
	return ok
}

// bridge carries the relayed half of a connection another relay sets
// up: c is the local node's attach; this relay attaches with the same
// token at the relay that set it up, and copies bytes between the two.
// That relay's attached, and everything after, passes through to c.
// It reports false if the token is no such connection's.
func (r *Relay) bridge(c net.Conn, token [tokenSize]byte) bool {
	r.mu.Lock()
	t := r.transit[token]
	if t != nil {
		t.expiry.Stop()
		delete(r.transit, token)
	}
	r.mu.Unlock()
	if t == nil {
		return false
	}
	defer r.untrack(c)
	ctx, cancel := context.WithTimeout(r.ctx, RendezvousTimeout)
	// As a member's end: the token proves it, the nodes' own encryption
	// runs inside.
	up, err := (&vlink.Dialer{Stack: vlink.MustParse("identity"), InsecurePlaintext: true}).DialContext(ctx, "tcp", t.via.data)
	cancel()
	if err == nil && !r.track(up) {
		up.Close()
		err = net.ErrClosed
	}
	if err == nil {
		defer r.untrack(up)
		up.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err = up.Write((&frame{op: opAttach, token: token}).append(nil))
		up.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		r.log.Info("control: relay: could not reach the relay that sets up a relayed connection", "relay", t.via.name, "at", t.via.data, "node", t.b.name, "err", err)
		netconn.Abort(c)
		if up != nil {
			netconn.Abort(up)
		}
		return true
	}
	c.SetDeadline(time.Time{})
	r.relayed.Add(1)
	r.relayedTotal.Add(1)
	defer r.relayed.Add(-1)
	toUp, fromUp, err := netconn.Relay(c, up)
	r.relayedBytes.Add(uint64(toUp + fromUp))
	r.log.Debug("control: relay: relayed through another relay", "node", t.b.name, "relay", t.via.name, "sent", toUp, "received", fromUp, "err", err)
	return true
}

// Peers returns the names of the relays this relay is linked with,
// sorted.
func (r *Relay) Peers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.links))
	for name := range r.links {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

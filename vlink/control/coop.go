package control

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
)

// An Expect describes one reply a cooperation waits for: from a given
// node (empty: any) and of a given type (zero: any). Paradis-Net's
// receive descriptor, with Go's memory management doing the rest.
type Expect struct {
	From string
	Type Type
}

func (e Expect) match(m *Message) bool {
	return (e.From == "" || e.From == m.From) && (e.Type == 0 || e.Type == m.Type)
}

// A Cooperation ties requests to the replies they expect (Paradis-Net):
// its token travels with every message sent through it and with the
// replies, which fill its expectations instead of reaching a handler.
// Scatter/gather is one cooperation sending to several nodes and
// expecting one reply from each.
type Cooperation struct {
	n      *Node
	token  uint64
	expect []Expect

	mu      sync.Mutex
	on      *channel   // the connection its last message went out on
	replies []*Message // aligned with expect; nil until filled
	errs    []error    // aligned with expect: why no reply can come; lazily made
	missing int        // expectations neither filled nor failed
	err     error
	done    chan struct{}
}

// A GatherError is a cooperation's error when some of the replies it
// expects cannot come (their node is offline, or its queue is full)
// while the others came: Wait returns those, and Errs, aligned with the
// expectations, says why each missing one is missing (nil where a reply
// came), as Paradis-Net's cooperations keep what arrived.
type GatherError struct {
	Errs []error
}

func (e *GatherError) Error() string {
	var b strings.Builder
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	fmt.Fprintf(&b, "control: cooperation: %d of %d replies cannot come", n, len(e.Errs))
	for i, err := range e.Errs {
		if err != nil {
			fmt.Fprintf(&b, "; reply %d: %v", i+1, err)
		}
	}
	return b.String()
}

// Unwrap returns why each missing reply is missing, so that errors.Is
// and errors.As find a *DeliveryError and its sentinel.
func (e *GatherError) Unwrap() []error {
	var out []error
	for _, err := range e.Errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// Cooperate starts a cooperation expecting the given replies, one
// message each, filled in order of arrival: a reply fills the first
// unfilled expectation it matches. With no expectations it expects one
// reply from anyone.
func (n *Node) Cooperate(expect ...Expect) *Cooperation {
	if len(expect) == 0 {
		expect = []Expect{{}}
	}
	c := &Cooperation{n: n, expect: expect, replies: make([]*Message, len(expect)), missing: len(expect), done: make(chan struct{})}
	n.mu.Lock()
	defer n.mu.Unlock()
	for {
		var b [8]byte
		rand.Read(b[:]) // unguessable: a reply can only come from who was asked
		c.token = binary.BigEndian.Uint64(b[:])
		if _, taken := n.coops[c.token]; c.token != 0 && !taken {
			break
		}
	}
	if n.ctx.Err() != nil {
		c.err = net.ErrClosed
		close(c.done)
		return c
	}
	n.coops[c.token] = c
	return c
}

// Send sends a message to a node within the cooperation: its replies
// come back to the cooperation. See Node.Send.
func (c *Cooperation) Send(ctx context.Context, to string, t Type, payload []byte) error {
	if err := checkName(to); err != nil {
		return err
	}
	ch, err := c.n.sendOn(ctx, &frame{op: opSend, typ: t, coop: c.token, name: to, payload: payload})
	if err == nil {
		c.sentOn(ch)
	}
	return err
}

// sentOn records that the cooperation sent on ch. Either the node's
// sweep after ch failed sees it, or this sees ch failed.
func (c *Cooperation) sentOn(ch *channel) {
	c.mu.Lock()
	c.on = ch
	c.mu.Unlock()
	if err := ch.Err(); err != nil {
		c.lost(ch, err)
	}
}

// ErrDisconnected is matched by the error of a cooperation whose
// connection to the relay failed after it sent: its messages or their
// replies may be lost. The node reconnects by itself; send again.
var ErrDisconnected = errors.New("control: the connection to the relay was lost")

// lost fails the cooperation if it sent on ch, which failed with err.
func (c *Cooperation) lost(ch *channel, err error) {
	c.mu.Lock()
	sent := c.on == ch
	c.mu.Unlock()
	if sent {
		c.finish(fmt.Errorf("%w (%v)", ErrDisconnected, err))
	}
}

// Wait waits until every expected reply arrived or cannot come, the
// cooperation failed, or ctx ends. It returns the replies aligned with
// the expectations, nil where none came. A message that could not be
// delivered to a node fails the expectation naming that node (From): the
// others are still waited for, and Wait then returns what came with a
// *GatherError saying why each missing reply is missing. One that names
// no expectation (From empty) fails the cooperation with its
// *DeliveryError. When ctx ends first the cooperation goes on: Wait
// again, or Cancel.
func (c *Cooperation) Wait(ctx context.Context) ([]*Message, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		return append([]*Message(nil), c.replies...), fmt.Errorf("control: cooperation: %d of %d replies missing: %w", c.missing, len(c.expect), ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replies, c.err
}

// Finished reports, without waiting, whether the cooperation is over.
func (c *Cooperation) Finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Done is closed when the cooperation is over, for a select.
func (c *Cooperation) Done() <-chan struct{} { return c.done }

// Cancel ends the cooperation; replies that arrive later are dropped.
// Wait returns context.Canceled.
func (c *Cooperation) Cancel() { c.finish(context.Canceled) }

// offer fills an expectation with m and reports whether m was taken.
func (c *Cooperation) offer(m *Message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.missing == 0 || c.err != nil {
		return false
	}
	for i, e := range c.expect {
		if c.replies[i] == nil && !c.failedLocked(i) && e.match(m) {
			c.replies[i] = m
			if c.missing--; c.missing == 0 {
				c.settleLocked()
			}
			return true
		}
	}
	return false
}

func (c *Cooperation) failedLocked(i int) bool { return c.errs != nil && c.errs[i] != nil }

// fail records that a message to the node named to was not delivered
// (err): the first pending expectation naming it will get no reply. An
// error that names no pending expectation ends the cooperation.
func (c *Cooperation) fail(to string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.missing == 0 || c.err != nil {
		return
	}
	for i, e := range c.expect {
		if e.From == to && c.replies[i] == nil && !c.failedLocked(i) {
			if c.errs == nil {
				c.errs = make([]error, len(c.expect))
			}
			c.errs[i] = err
			if c.missing--; c.missing == 0 {
				c.settleLocked()
			}
			return
		}
	}
	c.err = err
	c.closeLocked()
}

// settleLocked ends a cooperation with nothing pending: done, or with
// the missing replies' errors.
func (c *Cooperation) settleLocked() {
	if c.errs != nil {
		c.err = &GatherError{Errs: c.errs}
	}
	c.closeLocked()
}

// finish ends the cooperation with err unless it is over already.
func (c *Cooperation) finish(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.missing == 0 || c.err != nil {
		return
	}
	c.err = err
	c.closeLocked()
}

// closeLocked ends the cooperation; c.mu is held.
func (c *Cooperation) closeLocked() {
	close(c.done)
	c.n.mu.Lock()
	if c.n.coops[c.token] == c {
		delete(c.n.coops, c.token)
	}
	c.n.mu.Unlock()
}

// A Peer is a node as the relay's directory knows it.
type Peer struct {
	Name   string
	Online bool
	// Addrs are the addresses the relay saw the node connect from
	// (first) and those it advertised.
	Addrs []netip.AddrPort
}

// typePeer marks a lookup's answer inside the node; it never crosses the
// wire as a message type.
const typePeer Type = 0xffff

// Lookup asks the relay's directory about a node.
func (n *Node) Lookup(ctx context.Context, name string) (*Peer, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	c := n.Cooperate(Expect{Type: typePeer})
	defer c.Cancel()
	ch, err := n.sendOn(ctx, &frame{op: opLookup, coop: c.token, name: name})
	if err != nil {
		return nil, err
	}
	c.sentOn(ch)
	r, err := c.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return r[0].peer, nil // deliver lets only the relay's answers through
}

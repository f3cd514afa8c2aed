package control

import (
	"slices"
	"time"
)

// Bounds of what a node keeps for handlers to come; Node.Handle's doc
// states them.
const (
	// maxHeld bounds the messages kept, whatever their size.
	maxHeld = 1024
	// maxHeldBytes bounds their cost (heldCost): as much as a node queues
	// toward the relay by default, sixteen full payloads.
	maxHeldBytes = DefaultNodeQueue
	// heldAge is how long a message waits for its handler: long enough
	// for a program's set-up between Connect and Handle, well within the
	// relay's record of the delivery (recentTTL), which a handler's
	// Forward needs.
	heldAge = time.Minute
	// heldOverhead is what a kept message costs besides its payload and
	// names: the Message, the rest of its frame's body and the backlog's
	// entry, rounded up.
	heldOverhead = 256
	// heldLogEvery spaces the log lines about dropped messages, which a
	// flooding peer would otherwise turn into a flood of lines.
	heldLogEvery = 10 * time.Second
)

// heldCost counts the names twice: as strings, and in the frame's body,
// which the payload shares.
func heldCost(m *Message) int {
	return len(m.Payload) + 2*(len(m.From)+len(m.Via)) + heldOverhead
}

// A backlog keeps the messages of types with no handler yet, oldest
// first, as a socket's receive buffer keeps what the program has not
// read: bounded, the oldest dropped beyond the bounds. Node.mu guards it.
type backlog struct {
	msgs  []heldMsg
	bytes int // the msgs' heldCost
	// draining holds, for each type whose kept messages Handle is
	// dispatching, a channel closed when it is done: until then the
	// type's new messages wait behind them.
	draining map[Type]chan struct{}
	dropped  uint64    // since the start
	unlogged int       // dropped since the last log line
	logged   time.Time // when the last log line was written
}

type heldMsg struct {
	m  *Message
	at time.Time
}

// push keeps m, dropping the expired and then the oldest to make room.
func (b *backlog) push(m *Message, now time.Time) {
	b.expire(now)
	cost := heldCost(m)
	for len(b.msgs) > 0 && (len(b.msgs) >= maxHeld || b.bytes+cost > maxHeldBytes) {
		b.dropFront()
	}
	b.msgs = append(b.msgs, heldMsg{m, now})
	b.bytes += cost
}

// take removes and returns the oldest message of type t; nil if none.
func (b *backlog) take(t Type, now time.Time) *Message {
	b.expire(now)
	i := slices.IndexFunc(b.msgs, func(h heldMsg) bool { return h.m.Type == t })
	if i < 0 {
		return nil
	}
	m := b.msgs[i].m
	b.msgs = slices.Delete(b.msgs, i, i+1)
	b.bytes -= heldCost(m)
	return m
}

// has reports whether a message of type t is kept.
func (b *backlog) has(t Type) bool {
	return slices.ContainsFunc(b.msgs, func(h heldMsg) bool { return h.m.Type == t })
}

func (b *backlog) expire(now time.Time) {
	for len(b.msgs) > 0 && now.Sub(b.msgs[0].at) > heldAge {
		b.dropFront()
	}
}

func (b *backlog) dropFront() {
	b.bytes -= heldCost(b.msgs[0].m)
	b.msgs[0] = heldMsg{} // the array outlives the slice's front
	b.msgs = b.msgs[1:]
	b.dropped++
	b.unlogged++
}

// toLog returns how many messages were dropped since the last log line,
// and the total, when a line is due; zero when none is.
func (b *backlog) toLog(now time.Time) (n int, total uint64) {
	if b.unlogged == 0 || now.Sub(b.logged) < heldLogEvery {
		return 0, 0
	}
	n, b.unlogged, b.logged = b.unlogged, 0, now
	return n, b.dropped
}

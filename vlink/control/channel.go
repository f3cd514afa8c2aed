package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// writeTimeout bounds one write of queued frames: a peer that stops
// reading is cut off rather than holding its queue forever.
const writeTimeout = 30 * time.Second

// channel is one control connection's sending half, shared by the node
// and the relay: frames are queued, bounded in bytes, and written in
// batches by one goroutine, so that a sender never waits on the network
// and a slow peer holds at most maxQueue bytes.
type channel struct {
	c        net.Conn
	maxQueue int
	total    *budget // shared by the relay's channels; nil for none

	mu     sync.Mutex
	queue  [][]byte
	queued int
	wake   chan struct{} // the writer has work (capacity 1)
	space  chan struct{} // the writer freed room (closed and replaced)
	err    error         // why the channel ended; set once
	done   chan struct{} // closed when the channel ends
	closed sync.Once
}

// A budget bounds the bytes queued on all of a relay's channels.
type budget struct {
	n   atomic.Int64
	max int64
}

func newChannel(c net.Conn, maxQueue int, total *budget) *channel {
	ch := &channel{c: c, maxQueue: maxQueue, total: total, wake: make(chan struct{}, 1), space: make(chan struct{}), done: make(chan struct{})}
	go ch.writeLoop()
	return ch
}

// errFull is returned by trySend when the queue has no room.
var errFull = errors.New("control: send queue full")

// trySend queues f without waiting: errFull when the queue is full, the
// channel's error once it ended.
func (ch *channel) trySend(f *frame) error {
	b := f.append(nil)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.err != nil {
		return ch.err
	}
	if ch.queued > 0 && ch.queued+len(b) > ch.maxQueue {
		return errFull
	}
	if t := ch.total; t != nil {
		if t.n.Add(int64(len(b))) > t.max {
			t.n.Add(-int64(len(b)))
			return errFull
		}
	}
	ch.push(b)
	return nil
}

// send queues f, waiting for room while the queue is full.
func (ch *channel) send(ctx context.Context, f *frame) error {
	b := f.append(nil)
	for {
		ch.mu.Lock()
		if ch.err != nil {
			ch.mu.Unlock()
			return ch.err
		}
		if ch.queued == 0 || ch.queued+len(b) <= ch.maxQueue {
			ch.push(b)
			ch.mu.Unlock()
			return nil
		}
		space := ch.space
		ch.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// push queues b; ch.mu is held.
func (ch *channel) push(b []byte) {
	ch.queue = append(ch.queue, b)
	ch.queued += len(b)
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

func (ch *channel) writeLoop() {
	for {
		select {
		case <-ch.wake:
		case <-ch.done:
			return
		}
		ch.mu.Lock()
		batch, n := ch.queue, ch.queued
		ch.queue = nil
		ch.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		ch.c.SetWriteDeadline(time.Now().Add(writeTimeout))
		bufs := net.Buffers(batch)
		if _, err := bufs.WriteTo(ch.c); err != nil {
			ch.fail(fmt.Errorf("control: writing to %s: %w", ch.c.RemoteAddr(), err))
			return
		}
		ch.mu.Lock()
		if ch.err != nil { // fail released the whole queue, this batch too
			ch.mu.Unlock()
			return
		}
		ch.queued -= n
		if ch.total != nil {
			ch.total.n.Add(-int64(n))
		}
		close(ch.space)
		ch.space = make(chan struct{})
		ch.mu.Unlock()
	}
}

// flush waits until what is queued has been written, for at most
// timeout, or until the channel ends.
func (ch *channel) flush(timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		ch.mu.Lock()
		empty, space := ch.queued == 0, ch.space
		ch.mu.Unlock()
		if empty {
			return
		}
		select {
		case <-space:
		case <-ch.done:
			return
		case <-t.C:
			return
		}
	}
}

// fail ends the channel with err (the first error wins) and closes the
// connection, which ends the reader too.
func (ch *channel) fail(err error) {
	ch.closed.Do(func() {
		ch.mu.Lock()
		ch.err = err
		if ch.total != nil {
			ch.total.n.Add(-int64(ch.queued))
		}
		ch.queue = nil
		ch.queued = 0
		close(ch.space)
		ch.mu.Unlock()
		close(ch.done)
		ch.c.Close()
	})
}

// Err returns why the channel ended, or nil.
func (ch *channel) Err() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.err
}

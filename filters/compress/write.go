package compress

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Write sends p as frames of at most MaxBlock bytes before it returns.
// A frame goes out in one write, a run of raw frames in one writev when
// the underlying connection has it.
func (c *conn) Write(p []byte) (int, error) {
	c.ends.LockWrite()
	defer c.ends.UnlockWrite()
	ct, mark, err := c.startWrite()
	if err != nil {
		return 0, err
	}
	if ct != nil {
		defer func() { ct.spent(time.Since(mark)) }()
	}
	n := 0   // bytes of p sent (or, for a frame a deadline cut, in c.tail)
	run := 0 // p[run:off] are raw blocks waiting for one writev
	for off := 0; off < len(p); {
		blk := p[off:min(len(p), off+MaxBlock)]
		var fb *[]byte
		size := 0
		j, probe, try := c.plan(ct, mark, len(blk))
		if try {
			fb, size = c.attempt(ct, mark, j, probe, blk)
		}
		// Raw blocks of a Write of several blocks go out together in one
		// writev. A lone raw block is copied behind its header instead:
		// over loopback, one contiguous write of a 32 KiB block (what
		// io.Copy hands us) beats a writev of a 7-byte header and the
		// block, copy included (BENCHMARKS.txt).
		if size == 0 && c.vectored && len(p) > MaxBlock {
			putFrame(fb)
			if off += len(blk); off-run >= maxBatch*MaxBlock {
				k, err := c.writeRaw(p[run:off])
				n, run = n+k, off
				if err != nil {
					return n, err
				}
			}
			mark = c.account(ct, mark, j, len(blk), headerSize+len(blk), probe)
			continue
		}
		if run < off {
			k, err := c.writeRaw(p[run:off])
			n += k
			if err != nil {
				putFrame(fb)
				return n, err
			}
		}
		if size == 0 { // a raw frame, copied behind its header
			if fb == nil {
				fb = framePool.Get().(*[]byte)
			}
			(*header)(*fb).set(frameRaw, len(blk), len(blk))
			size = headerSize + copy((*fb)[headerSize:], blk)
		}
		sent, err := c.send(fb, size)
		if sent {
			n += len(blk)
		}
		if err != nil {
			return n, err
		}
		off += len(blk)
		run = off
		mark = c.account(ct, mark, j, len(blk), size, probe)
	}
	if run < len(p) {
		k, err := c.writeRaw(p[run:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// startWrite readies the write side for a write, sending first what a
// deadline left of the last frame. It returns the auto layer's
// controller, which times each block (control.go), and the time the
// first block starts: mark. The write lock is held.
func (c *conn) startWrite() (ct *controller, mark time.Time, err error) {
	if err := c.ends.Writable(); err != nil {
		return nil, mark, err
	}
	if err := c.flushTail(); err != nil {
		return nil, mark, err
	}
	if ct = c.controller(); ct != nil {
		mark = time.Now()
	}
	return ct, mark, nil
}

// controller returns the auto layer's controller, made by the first
// write; nil for a fixed layer.
func (c *conn) controller() *controller {
	if c.ctrl == nil && c.rungs != nil {
		c.ctrl = newController(c.rungs, linkSampler(c.c))
	}
	return c.ctrl
}

// plan decides how the next block, of n bytes, goes: at which rung j (the
// auto layer's; 0 for a fixed layer), whether as a probe, and whether
// compressing it is to be tried at all.
func (c *conn) plan(ct *controller, mark time.Time, n int) (j int, probe, try bool) {
	if ct == nil {
		return 0, false, c.tryCompress(n)
	}
	j, probe = ct.pick(mark)
	return j, probe, j > 0 && (probe && n >= minCompress || !probe && c.tryCompress(n))
}

// attempt compresses blk as plan said, telling the controller how it
// went, and returns compress's frame and size: 0 to send blk raw.
func (c *conn) attempt(ct *controller, mark time.Time, j int, probe bool, blk []byte) (fb *[]byte, size int) {
	if ct == nil {
		return c.compress(c.codec, 0, blk, true)
	}
	r := &c.rungs[j]
	fb, size = c.compress(r.codec, r.id, blk, !probe)
	wire := size
	if size == 0 {
		wire = headerSize + len(blk)
	}
	ct.tried(j, len(blk), wire, time.Since(mark), size > 0, probe)
	return fb, size
}

// account counts a block sent since mark, for Stats, tells the
// controller, if any, about it, and returns the new mark.
func (c *conn) account(ct *controller, mark time.Time, j, raw, wire int, probe bool) time.Time {
	c.cnt.written.Add(uint64(raw))
	c.cnt.sent.Add(uint64(wire))
	if ct == nil {
		return mark
	}
	c.rungUsed[j].Add(uint64(raw))
	now := time.Now()
	ct.account(j, raw, wire, probe, now.Sub(mark))
	return now
}

func (c *conn) tryCompress(n int) bool {
	if n < minCompress {
		return false
	}
	if c.skip > 0 {
		c.skip--
		return false
	}
	return true
}

// compress builds a compressed frame of blk by codec, named id in its
// header, in a pooled buffer and returns it with the frame's size, or a
// size of 0 if blk does not compress well. With backoff, a failure makes
// the writer skip a growing number of blocks before the next try.
func (c *conn) compress(codec blockCodec, id codecID, blk []byte, backoff bool) (fb *[]byte, size int) {
	fb = framePool.Get().(*[]byte)
	b := *fb
	m := codec.compress(b[headerSize:], blk, len(blk)-len(blk)>>minSavingShift)
	if m == 0 {
		if backoff {
			// Incompressible: skip a growing number of blocks before the next try.
			c.backoff = min(max(1, 2*c.backoff), maxBackoff)
			c.skip = c.backoff
		}
		return fb, 0
	}
	if backoff {
		c.backoff = 0
	}
	(*header)(b).setCodec(frameCompressed, id, len(blk), m)
	return fb, headerSize + m
}

// send writes the frame in (*fb)[:size] and frees fb. If a deadline cuts
// the frame, the peer already has part of it: the rest is kept in c.tail,
// to be sent before anything else, and the frame counts as sent, as it
// would with a buffered writer.
func (c *conn) send(fb *[]byte, size int) (sent bool, err error) {
	frame := (*fb)[:size]
	k, err := c.c.Write(frame)
	if err == nil {
		framePool.Put(fb)
		return true, nil
	}
	if k == 0 || !errors.Is(err, os.ErrDeadlineExceeded) || c.ends.Closed() {
		framePool.Put(fb)
		return false, c.ends.WriteErr(err)
	}
	c.tail, c.tailData = fb, frame[k:]
	return true, err
}

// maxBatch is the most raw frames one writev sends.
const maxBatch = 8

// A batch holds the headers and the I/O vector of one writev.
type batch struct {
	hdrs [maxBatch]header
	vec  [2 * maxBatch][]byte
	bufs net.Buffers
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

// writeRaw sends run, at most maxBatch blocks, as raw frames in one
// writev, and returns how many of its bytes were sent. A frame a deadline
// cuts counts as sent, its rest kept in c.tail as in send.
func (c *conn) writeRaw(run []byte) (int, error) {
	b := batchPool.Get().(*batch)
	nv := 0
	for off := 0; off < len(run); off += MaxBlock {
		blk := run[off:min(len(run), off+MaxBlock)]
		h := &b.hdrs[nv/2]
		h.set(frameRaw, len(blk), len(blk))
		b.vec[nv], b.vec[nv+1] = h[:], blk
		nv += 2
	}
	b.bufs = b.vec[:nv]
	k64, err := b.bufs.WriteTo(c.c) // consumes b.bufs
	clear(b.vec[:nv])               // keep no reference to the caller's p
	b.bufs = nil
	batchPool.Put(b)
	if err == nil {
		return len(run), nil
	}
	k, sent := int(k64), 0
	for off := 0; off < len(run) && k > 0; off += MaxBlock {
		blk := run[off:min(len(run), off+MaxBlock)]
		if k >= headerSize+len(blk) {
			k -= headerSize + len(blk)
			sent += len(blk)
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || c.ends.Closed() {
			break
		}
		fb := framePool.Get().(*[]byte)
		(*header)(*fb).set(frameRaw, len(blk), len(blk))
		copy((*fb)[headerSize:], blk)
		c.tail, c.tailData = fb, (*fb)[k:headerSize+len(blk)]
		return sent + len(blk), err
	}
	return sent, c.ends.WriteErr(err)
}

// flushTail sends what a deadline left of the last frame.
func (c *conn) flushTail() error {
	if c.tail == nil {
		return nil
	}
	k, err := c.c.Write(c.tailData)
	c.tailData = c.tailData[k:]
	if err != nil {
		return c.ends.WriteErr(err)
	}
	c.dropTail()
	return nil
}

func (c *conn) dropTail() {
	if c.tail != nil {
		framePool.Put(c.tail)
		c.tail, c.tailData = nil, nil
	}
}

func putFrame(fb *[]byte) {
	if fb != nil {
		framePool.Put(fb)
	}
}

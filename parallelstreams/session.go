package parallelstreams

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// blockCost is what a data block counts against the window beyond its
// payload, so that a peer sending many tiny blocks cannot make the
// receiver hold more block records than the window allows for.
const blockCost = 512

// lingerTimeout bounds how long a closed session keeps sending what was
// written before Close, as the kernel does for a closed TCP socket, and
// then how long it drains its substreams (see fail).
const lingerTimeout = 10 * time.Second

// A block is a piece of one direction's stream.
type block struct {
	t    blockType
	seq  uint64
	data []byte // payload; from a pool, see getBuf
	off  int    // bytes of data already read by the application
}

// Buffers come in three size classes, so a tiny block never holds a
// MaxBlock buffer.
var pools = [...]struct {
	size int
	pool sync.Pool
}{{size: 4 << 10}, {size: 32 << 10}, {size: MaxBlock}}

func getBuf(n int) []byte {
	for i := range pools {
		if n <= pools[i].size {
			if b, ok := pools[i].pool.Get().(*[]byte); ok {
				return (*b)[:n]
			}
			return make([]byte, n, pools[i].size)
		}
	}
	panic("parallelstreams: buffer larger than MaxBlock")
}

func putBuf(b []byte) {
	for i := range pools {
		if cap(b) == pools[i].size {
			b = b[:0]
			pools[i].pool.Put(&b)
			return
		}
	}
}

// A substream is one of the session's connections.
type substream struct {
	index int
	c     net.Conn
	eof   bool // the peer closed it cleanly; guarded by session.mu
	// Guarded by session.mu: the reader has returned; the reader closes
	// c when it returns (a drain, see fail).
	readerDone, draining bool
}

// Session is one connection striped over several substreams. Both sides
// run the same engine once the substreams are joined. It implements
// net.Conn with io.ReaderFrom and io.WriterTo.
//
// Writes are cut into numbered blocks, queued, and taken by whichever
// substream's writer is free first, so a slow substream only slows its
// own blocks. The receiver puts blocks back in order; it grants the
// sender credit for at most Window bytes beyond what the application has
// read, which bounds its memory and makes a slow reader slow the writer
// down. If a substream fails, the whole session fails with an error that
// names it: bytes are delivered in order or not at all.
type Session struct {
	id            sessionID
	window        int64
	stallTimeout  time.Duration
	local, remote net.Addr

	mu   sync.Mutex
	work *sync.Cond // writers wait here for blocks or control messages
	subs []*substream

	// Sending.
	queue     []*block // blocks not yet taken by a writer, in order
	queued    int64    // their cost
	nextSeq   uint64
	sent      int64 // cost of the data blocks taken by writers
	credit    int64 // the peer lets sent reach this
	ctrl      []uint64
	inflight  int  // blocks taken by writers, not yet written
	finQueued bool // CloseWrite or Close queued the fin
	finSent   bool
	writable  chan struct{} // signalled when queue space or credit frees

	// Receiving.
	recv       map[uint64]*block // blocks not yet read, by sequence number
	head       *block            // the block the application is reading
	next       uint64            // sequence number of the next block to read
	buffered   int64             // cost of the blocks held
	maxSeq     uint64            // largest data sequence number received, +1
	finSeq     uint64
	finRecv    bool
	consumed   int64 // cost of the blocks the application has read
	advertised int64 // consumed when credit was last granted
	readable   chan struct{}

	rdl, wdl netconn.Deadline

	closing   chan struct{} // closed by Close: the application is done
	closeOnce sync.Once
	die       chan struct{} // closed when the substreams are torn down
	dieOnce   sync.Once
	err       error // why the session died; set before die is closed

	wg     sync.WaitGroup // readers, writers and the grower
	grower *grower        // the dialer's side in auto mode, or nil
}

var (
	_ net.Conn            = (*Session)(nil)
	_ io.ReaderFrom       = (*Session)(nil)
	_ io.WriterTo         = (*Session)(nil)
	_ netconn.CloseWriter = (*Session)(nil)
)

// newSession starts a session over its first substreams.
func newSession(id sessionID, window int64, stall time.Duration, conns []net.Conn) *Session {
	s := &Session{
		id:           id,
		window:       window,
		stallTimeout: stall,
		local:        conns[0].LocalAddr(),
		remote:       conns[0].RemoteAddr(),
		credit:       window,
		writable:     make(chan struct{}, 1),
		recv:         map[uint64]*block{},
		readable:     make(chan struct{}, 1),
		closing:      make(chan struct{}),
		die:          make(chan struct{}),
	}
	s.work = sync.NewCond(&s.mu)
	stats.sessions.Add(1)
	s.mu.Lock()
	for _, c := range conns {
		s.addLocked(c)
	}
	s.mu.Unlock()
	return s
}

// add puts one more substream to work (auto mode). It reports false if
// the session is already over, in which case the caller closes c.
func (s *Session) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isDead() || s.isClosing() {
		return false
	}
	s.addLocked(c)
	return true
}

func (s *Session) addLocked(c net.Conn) {
	tune(c)
	sub := &substream{index: len(s.subs), c: c}
	stats.substreams.Add(1)
	s.subs = append(s.subs, sub)
	s.wg.Add(2)
	go s.reader(sub)
	go s.writer(sub)
}

// Streams returns how many substreams the session has now.
func (s *Session) Streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.subs)
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Session) isDead() bool {
	select {
	case <-s.die:
		return true
	default:
		return false
	}
}

func (s *Session) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// fail tears the session down once, keeping the first error.
//
// After this side's Close, once all it wrote has gone (errClosed), the
// substreams are not closed outright but drained: each sends its end,
// and its reader reads and drops what still comes until the peer's end,
// or for lingerTimeout, then closes it. The peer may still be receiving
// the tail of the stream and granting credit for it: a closed TCP socket
// answers that credit with a reset, which throws away the tail it has not
// yet delivered, and a closed QUIC stream tells the peer to stop sending,
// failing the credit's write and with it the peer's session.
func (s *Session) fail(err error) {
	s.dieOnce.Do(func() {
		s.mu.Lock()
		s.err = err
		close(s.die)
		stats.ended.Add(1)
		subs := s.subs
		for _, sub := range subs {
			sub.draining = err == errClosed && !sub.readerDone
		}
		s.work.Broadcast()
		s.mu.Unlock()
		for _, sub := range subs {
			switch {
			case sub.draining:
				netconn.CloseWrite(sub.c)
				sub.c.SetReadDeadline(time.Now().Add(lingerTimeout))
			case err == errClosed || err == errPeerClosed:
				sub.c.Close()
			default:
				netconn.Abort(sub.c) // the peer must not take this for an end
			}
		}
	})
}

// failure returns the error an operation reports once the session is
// dead or closed.
func (s *Session) failure(op string) error {
	if s.isClosing() {
		return s.opError(op, net.ErrClosed)
	}
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	return s.opError(op, err)
}

func (s *Session) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "parallel", Source: s.local, Addr: s.remote, Err: err}
}

// writer sends blocks on one substream, taking whichever block is next
// when its previous write has finished.
func (s *Session) writer(sub *substream) {
	defer s.wg.Done()
	var h header
	bufs := make(net.Buffers, 0, 2)
	for {
		s.mu.Lock()
		var b *block
		var creditValue uint64
		for {
			if s.isDead() {
				s.mu.Unlock()
				return
			}
			if len(s.ctrl) > 0 {
				creditValue = s.ctrl[len(s.ctrl)-1]
				s.ctrl = s.ctrl[:0]
				break
			}
			if len(s.queue) > 0 && (s.queue[0].t == blockFin || s.sent < s.credit) {
				b = s.queue[0]
				s.queue[0] = nil
				s.queue = s.queue[1:]
				if b.t == blockData {
					cost := int64(len(b.data)) + blockCost
					s.queued -= cost
					s.sent += cost
					notify(s.writable)
				}
				break
			}
			s.work.Wait()
		}
		s.inflight++
		if len(s.queue) > 0 || len(s.ctrl) > 0 {
			s.work.Signal() // more for another writer
		}
		s.mu.Unlock()

		if b == nil {
			h.set(blockCredit, 0, creditValue)
		} else {
			h.set(b.t, len(b.data), b.seq)
		}
		bufs = append(bufs[:0], h[:])
		if b != nil && len(b.data) > 0 {
			bufs = append(bufs, b.data)
		}
		if s.stallTimeout > 0 {
			sub.c.SetWriteDeadline(time.Now().Add(s.stallTimeout))
		}
		_, err := bufs.WriteTo(sub.c)
		if b != nil {
			putBuf(b.data)
		}

		s.mu.Lock()
		s.inflight--
		if b != nil && b.t == blockFin {
			s.finSent = true
		}
		flushed := s.finSent && s.inflight == 0 && len(s.queue) == 0
		closing := s.isClosing()
		s.mu.Unlock()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("no progress for %v (stall-timeout)", s.stallTimeout)
			}
			s.fail(&SubstreamError{Index: sub.index, Op: "write", Err: err})
			return
		}
		if flushed && closing {
			s.fail(errClosed) // Close's linger is over: all was sent
			return
		}
	}
}

// reader receives blocks on one substream and files them by sequence.
func (s *Session) reader(sub *substream) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		sub.readerDone = true
		drained := sub.draining
		s.mu.Unlock()
		if drained {
			sub.c.Close()
		}
	}()
	var h header
	for {
		if _, err := io.ReadFull(sub.c, h[:]); err != nil {
			s.readerDone(sub, err, true)
			return
		}
		if err := h.check(); err != nil {
			s.fail(&SubstreamError{Index: sub.index, Op: "read", Err: err})
			return
		}
		if s.isDead() { // draining: what comes now is dropped
			if _, err := io.CopyN(io.Discard, sub.c, int64(h.Len())); err != nil {
				return
			}
			continue
		}
		switch h.Type() {
		case blockCredit:
			s.mu.Lock()
			if v := int64(h.Value()); v > s.credit {
				s.credit = v
				s.work.Broadcast()
			}
			s.mu.Unlock()
		case blockFin:
			if err := s.fileFin(h.Value()); err != nil {
				s.fail(&SubstreamError{Index: sub.index, Op: "read", Err: err})
				return
			}
		case blockData:
			buf := getBuf(h.Len())
			if _, err := io.ReadFull(sub.c, buf); err != nil {
				putBuf(buf)
				s.readerDone(sub, err, false)
				return
			}
			if err := s.fileData(h.Value(), buf); err != nil {
				putBuf(buf)
				s.fail(&SubstreamError{Index: sub.index, Op: "read", Err: err})
				return
			}
		}
	}
}

// readerDone handles the end of a substream's incoming side. A clean end
// between blocks is the peer closing: fine once its fin has come, or will
// come on another substream; the session fails if every substream ends
// without it. Anything else fails the session at once.
func (s *Session) readerDone(sub *substream, err error, atBoundary bool) {
	if s.isDead() {
		return
	}
	if !atBoundary || !errors.Is(err, io.EOF) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		s.fail(&SubstreamError{Index: sub.index, Op: "read", Err: err})
		return
	}
	s.mu.Lock()
	sub.eof = true
	all := true
	for _, o := range s.subs {
		all = all && o.eof
	}
	fin := s.finRecv
	s.mu.Unlock()
	switch {
	case all && !fin:
		s.fail(fmt.Errorf("peer closed every substream before ending its stream: %w", io.ErrUnexpectedEOF))
	case all:
		// The peer closed the connection: what it sent can still be
		// read, but nothing more can be sent.
		s.fail(errPeerClosed)
	}
	notify(s.readable)
}

func (s *Session) fileData(seq uint64, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, dup := s.recv[seq]
	switch {
	case seq < s.next || dup:
		return fmt.Errorf("%w: data block %d received twice", ErrProtocol, seq)
	case s.finRecv && seq >= s.finSeq:
		return fmt.Errorf("%w: data block %d after the fin at %d", ErrProtocol, seq, s.finSeq)
	case seq == math.MaxUint64:
		// maxSeq, seq+1, would wrap to 0 and let a fin below this block
		// end the stream without it. No real stream numbers this far.
		return fmt.Errorf("%w: data block number %d out of range", ErrProtocol, seq)
	}
	cost := int64(len(data)) + blockCost
	if s.buffered+cost > s.window+MaxBlock+blockCost {
		return fmt.Errorf("%w: peer sent beyond its credit (%d bytes held, window %d)", ErrProtocol, s.buffered+cost, s.window)
	}
	s.buffered += cost
	s.recv[seq] = &block{t: blockData, seq: seq, data: data}
	s.maxSeq = max(s.maxSeq, seq+1)
	if seq == s.next {
		notify(s.readable)
	} else {
		stats.outOfOrder.Add(1)
	}
	return nil
}

func (s *Session) fileFin(seq uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.finRecv:
		return fmt.Errorf("%w: second fin", ErrProtocol)
	case seq < s.maxSeq || seq < s.next:
		return fmt.Errorf("%w: fin at %d before data block %d", ErrProtocol, seq, max(s.maxSeq, s.next)-1)
	}
	if _, dup := s.recv[seq]; dup {
		return fmt.Errorf("%w: fin at %d, a data block's number", ErrProtocol, seq)
	}
	s.finRecv, s.finSeq = true, seq
	notify(s.readable)
	return nil
}

// nextBlockLocked makes the next block in order the head, if it is here.
func (s *Session) nextBlockLocked() *block {
	if s.head == nil {
		if b, ok := s.recv[s.next]; ok {
			delete(s.recv, s.next)
			s.next++
			s.head = b
		}
	}
	return s.head
}

// consumedLocked accounts for n bytes read out of the head block, and
// grants the peer more credit once an eighth of the window is free: the
// finer the grants, the less of the window waits for one.
func (s *Session) consumedLocked(n int) {
	h := s.head
	h.off += n
	s.consumed += int64(n)
	s.buffered -= int64(n)
	if h.off == len(h.data) {
		s.consumed += blockCost
		s.buffered -= blockCost
		putBuf(h.data)
		s.head = nil
	}
	if s.consumed-s.advertised >= s.window/8 {
		s.advertised = s.consumed
		s.ctrl = append(s.ctrl, uint64(s.consumed+s.window))
		s.work.Signal()
	}
}

// Read reads the stream in order.
func (s *Session) Read(p []byte) (int, error) {
	for {
		if s.isClosing() {
			return 0, s.opError("read", net.ErrClosed)
		}
		if s.rdl.Exceeded() {
			// As in package net, a passed deadline fails the call even
			// if data is waiting.
			return 0, s.opError("read", os.ErrDeadlineExceeded)
		}
		// Death is seen before the blocks are: what was filed before it
		// (a fin, then the peer closing) is then read, not lost to it.
		dead := s.isDead()
		s.mu.Lock()
		n := 0
		for n < len(p) {
			b := s.nextBlockLocked()
			if b == nil {
				break
			}
			m := copy(p[n:], b.data[b.off:])
			n += m
			s.consumedLocked(m)
		}
		eof := s.head == nil && s.finRecv && s.next == s.finSeq
		s.mu.Unlock()
		switch {
		case n > 0 || len(p) == 0:
			return n, nil
		case eof:
			return 0, io.EOF
		case dead:
			return 0, s.failure("read")
		}
		select {
		case <-s.readable:
		case <-s.rdl.Done():
		case <-s.die:
		case <-s.closing:
		}
	}
}

// WriteTo writes the stream to w from the session's own buffers, saving
// the copy into a caller's buffer.
func (s *Session) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if s.isClosing() {
			return total, s.opError("read", net.ErrClosed)
		}
		dead := s.isDead() // before the blocks, as in Read
		s.mu.Lock()
		b := s.nextBlockLocked()
		eof := b == nil && s.finRecv && s.next == s.finSeq
		s.mu.Unlock()
		if b != nil {
			// Only this reader touches the head block's data; the lock
			// guards the accounting.
			n, err := w.Write(b.data[b.off:])
			total += int64(n)
			s.mu.Lock()
			if s.head == b {
				s.consumedLocked(n)
			}
			s.mu.Unlock()
			if err != nil {
				return total, err
			}
			continue
		}
		switch {
		case eof:
			return total, nil
		case dead:
			return total, s.failure("read")
		case s.rdl.Exceeded():
			return total, s.opError("read", os.ErrDeadlineExceeded)
		}
		select {
		case <-s.readable:
		case <-s.rdl.Done():
		case <-s.die:
		case <-s.closing:
		}
	}
}

// sendLimit bounds the bytes queued for the writers, beyond those they
// are writing.
func (s *Session) sendLimitLocked() int64 {
	return max(1<<20, int64(2*len(s.subs))*(MaxBlock+blockCost))
}

// waitWritable waits until the queue has room. It returns an error once
// the session is closed, dead or past its write deadline.
func (s *Session) waitWritable() error {
	for {
		if s.isClosing() {
			return s.opError("write", net.ErrClosed)
		}
		s.mu.Lock()
		fin := s.finQueued
		room := s.queued < s.sendLimitLocked()
		s.mu.Unlock()
		switch {
		case s.wdl.Exceeded():
			return s.opError("write", os.ErrDeadlineExceeded)
		case s.isDead():
			return s.failure("write")
		case fin:
			return s.opError("write", errWriteAfterCloseWrite)
		case room:
			return nil
		}
		select {
		case <-s.writable:
		case <-s.wdl.Done():
		case <-s.die:
		case <-s.closing:
		}
	}
}

// A SubstreamError is why a session failed when one of its substreams
// failed: which one, in which direction, and the error it met.
type SubstreamError struct {
	Index int    // 0-based, in the order the dialer opened them
	Op    string // "read" or "write"
	Err   error
}

func (e *SubstreamError) Error() string {
	return fmt.Sprintf("substream %d: %s: %v", e.Index, e.Op, e.Err)
}

func (e *SubstreamError) Unwrap() error { return e.Err }

var (
	errWriteAfterCloseWrite = errors.New("write after CloseWrite")
	errPeerClosed           = errors.New("connection closed by peer")
	// errClosed ends a session closed by its application once all it
	// wrote is sent.
	errClosed = fmt.Errorf("session closed: %w", net.ErrClosed)
	// errAborted ends a session its application aborted.
	errAborted = fmt.Errorf("session aborted: %w", net.ErrClosed)
)

var _ netconn.Aborter = (*Session)(nil)

// Write queues p for the substreams. It returns once p is queued, not
// sent; a small write goes out at once in a block of its own, or joins
// the last queued block if no writer has taken it yet.
func (s *Session) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) || len(p) == 0 {
		if err := s.waitWritable(); err != nil {
			return n, err
		}
		if len(p) == 0 {
			return 0, nil
		}
		s.mu.Lock()
		if s.finQueued || s.isDead() {
			s.mu.Unlock()
			continue // waitWritable reports it
		}
		if k := len(s.queue); k > 0 && s.queue[k-1].t == blockData {
			if tail := s.queue[k-1]; cap(tail.data) > len(tail.data) {
				m := copy(tail.data[len(tail.data):cap(tail.data)], p[n:])
				tail.data = tail.data[:len(tail.data)+m]
				s.queued += int64(m)
				n += m
			}
		}
		if n < len(p) {
			m := min(len(p)-n, MaxBlock)
			buf := getBuf(m)
			copy(buf, p[n:n+m])
			s.enqueueLocked(buf)
			n += m
		}
		s.mu.Unlock()
	}
	return n, nil
}

func (s *Session) enqueueLocked(data []byte) {
	s.queue = append(s.queue, &block{t: blockData, seq: s.nextSeq, data: data})
	s.nextSeq++
	s.queued += int64(len(data)) + blockCost
	s.work.Signal()
}

// ReadFrom reads from r straight into blocks, saving Write's copy.
func (s *Session) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		if err := s.waitWritable(); err != nil {
			return total, err
		}
		buf := getBuf(MaxBlock)
		n, err := r.Read(buf)
		if n > 0 {
			s.mu.Lock()
			if s.finQueued || s.isDead() || s.isClosing() {
				s.mu.Unlock()
				putBuf(buf)
				return total, s.waitWritable()
			}
			s.enqueueLocked(buf[:n])
			s.mu.Unlock()
			total += int64(n)
		} else {
			putBuf(buf)
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// CloseWrite ends the outgoing stream after what has been written: the
// peer reads it all, then io.EOF. It returns at once; the substreams send
// the rest.
func (s *Session) CloseWrite() error {
	if s.isClosing() {
		return s.opError("close", net.ErrClosed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isDead() {
		return s.opError("close", s.err)
	}
	s.queueFinLocked()
	return nil
}

func (s *Session) queueFinLocked() {
	if s.finQueued {
		return
	}
	s.finQueued = true
	s.queue = append(s.queue, &block{t: blockFin, seq: s.nextSeq})
	s.nextSeq++
	s.work.Signal()
}

// Close closes the session: Read and Write return net.ErrClosed at once,
// and, as the kernel does for a TCP socket, what was written before is
// still sent, followed by the end of the stream, for at most
// lingerTimeout; then the substreams close.
func (s *Session) Close() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		close(s.closing)
		s.mu.Lock()
		s.queueFinLocked()
		flushed := s.finSent && s.inflight == 0 && len(s.queue) == 0
		s.mu.Unlock()
		if flushed {
			s.fail(errClosed)
			return
		}
		t := time.AfterFunc(lingerTimeout, func() {
			s.fail(fmt.Errorf("closed with data still unsent after %v: %w", lingerTimeout, net.ErrClosed))
		})
		go func() {
			<-s.die
			t.Stop()
			s.releaseBuffers()
		}()
	})
	if !first {
		return s.opError("close", net.ErrClosed)
	}
	return nil
}

// Abort ends the session as a failure, as a relay does when the other
// side of its stream failed: nothing more is sent, no end of stream, and
// the substreams are reset, so the peer fails rather than reading an end.
// Read and Write return net.ErrClosed at once. After Close, it cuts
// Close's linger short.
func (s *Session) Abort() error {
	first := false
	s.closeOnce.Do(func() {
		first = true
		close(s.closing)
		go func() {
			<-s.die
			s.releaseBuffers()
		}()
	})
	s.fail(errAborted)
	if !first {
		return s.opError("close", net.ErrClosed)
	}
	return nil
}

// releaseBuffers returns the buffers of blocks nobody will read or send,
// once every reader and writer has stopped.
func (s *Session) releaseBuffers() {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.queue {
		putBuf(b.data)
	}
	for _, b := range s.recv {
		putBuf(b.data)
	}
	s.queue, s.recv, s.head = nil, nil, nil
}

func (s *Session) LocalAddr() net.Addr  { return s.local }
func (s *Session) RemoteAddr() net.Addr { return s.remote }

// SetDeadline sets both deadlines. They apply to the session's Read and
// Write, including calls already blocked; the substreams carry on.
func (s *Session) SetDeadline(t time.Time) error {
	s.rdl.Set(t)
	s.wdl.Set(t)
	return s.deadlineErr()
}

func (s *Session) SetReadDeadline(t time.Time) error {
	s.rdl.Set(t)
	return s.deadlineErr()
}

func (s *Session) SetWriteDeadline(t time.Time) error {
	s.wdl.Set(t)
	return s.deadlineErr()
}

func (s *Session) deadlineErr() error {
	if s.isClosing() {
		return s.opError("set", net.ErrClosed)
	}
	return nil
}

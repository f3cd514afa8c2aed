package ssh

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// readChunk is the size of the read-ahead buffers: an SSH channel
// packet's payload is at most 32 KiB, and a read returns at most one.
const readChunk = 32 << 10

// writeChunk is the size of the write-behind buffers. A chunk holds
// several packets, so the writer goroutine wakes once for all of them.
const writeChunk = 128 << 10

// writeBufs recycles write chunks: a connection holds them only while it
// has data in flight, so idle connections cost no write buffer.
var writeBufs = sync.Pool{New: func() any { return new([writeChunk]byte) }}

// flushTimeout bounds how long a closed connection keeps sending what it
// had accepted before it closes the channel anyway.
const flushTimeout = 10 * time.Second

// channel is what the tunnel needs of an SSH channel: x/crypto/ssh's
// Channel, or the net.Conn its listener returns, which embeds one.
type channel interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// conn is a net.Conn over an SSH channel, with what x/crypto/ssh's
// channels lack: deadlines that apply to I/O in progress, a Close that
// unblocks everything, and an error for a lost SSH connection.
//
// x/crypto/ssh's channel Read and Write block inside the package, out of
// reach of a deadline or of Close, so each conn has a reader goroutine
// that reads ahead into at most two chunks and a writer goroutine that
// writes behind from at most two: Read and Write wait on channels, which
// a netconn.Deadline or Close interrupts. Write returns once the data is
// handed to the writer, as a kernel socket returns once the data is in
// its send buffer; Close and CloseWrite send what was handed over first.
type conn struct {
	ch           channel
	laddr, raddr net.Addr
	// lost says why the SSH connection ended, nil while it is up.
	lost func() error
	// onEOF, if set, may turn the channel's EOF into an error (netcat
	// mode: a command that failed before sending anything).
	onEOF func(received int64) error
	// done runs once the channel is closed and the writer has finished.
	done func()

	closeOnce sync.Once
	closed    chan struct{}

	// read side: the reader goroutine fills rq, Read drains it.
	rmu      sync.Mutex
	rdl      netconn.Deadline
	rq       chan []byte // filled chunks
	rfree    chan []byte // chunks for the reader to fill
	rcur     []byte      // what is left of the chunk being read
	rbuf     []byte      // that chunk, to give back
	rdone    chan struct{}
	rerr     error // why reading ended, once rdone is closed
	received int64 // owned by the reader goroutine

	// write side: Write fills wq, the writer goroutine drains it.
	wmu        sync.Mutex
	wdl        netconn.Deadline
	wq         chan wchunk
	wtokens    chan struct{} // one per chunk in flight, at most 2
	wdone      chan struct{}
	werr       error // why writing ended, once wdone is closed
	shut       chan struct{}
	shutOnce   sync.Once
	wantShut   bool // CloseWrite was called (under wmu)
	writerGone chan struct{}
}

var (
	_ net.Conn            = (*conn)(nil)
	_ netconn.CloseWriter = (*conn)(nil)
	_ io.ReaderFrom       = (*conn)(nil)
)

func newConn(ch channel, laddr, raddr net.Addr, lost func() error, done func()) *conn {
	c := &conn{
		ch: ch, laddr: laddr, raddr: raddr, lost: lost, done: done,
		closed:     make(chan struct{}),
		rq:         make(chan []byte, 2),
		rfree:      make(chan []byte, 2),
		rdone:      make(chan struct{}),
		wq:         make(chan wchunk, 2),
		wtokens:    make(chan struct{}, 2),
		wdone:      make(chan struct{}),
		shut:       make(chan struct{}),
		writerGone: make(chan struct{}),
	}
	return c
}

// start runs the reader and writer goroutines; onEOF must be set before.
func (c *conn) start() {
	go c.reader()
	go c.writer()
}

func (c *conn) reader() {
	made := 0
	for {
		var buf []byte
		select {
		case buf = <-c.rfree:
		default:
			if made < 2 {
				buf, made = make([]byte, readChunk), made+1
			} else {
				select {
				case buf = <-c.rfree:
				case <-c.closed:
					c.endRead(net.ErrClosed)
					return
				}
			}
		}
		n, err := c.ch.Read(buf)
		if n > 0 {
			c.received += int64(n)
			c.rq <- buf[:n] // never blocks: two chunks exist, rq holds two
		} else {
			c.rfree <- buf
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if lerr := c.lost(); lerr != nil {
					err = fmt.Errorf("%w: %w", ErrLost, lerr)
				} else if c.onEOF != nil {
					if cerr := c.onEOF(c.received); cerr != nil {
						err = cerr
					}
				}
			}
			c.endRead(err)
			return
		}
	}
}

func (c *conn) endRead(err error) {
	c.rerr = err
	close(c.rdone)
}

func (c *conn) writer() {
	defer close(c.writerGone)
	fail := func(err error) {
		if errors.Is(err, io.EOF) {
			// x/crypto/ssh's channel: the peer closed it, or the
			// connection is gone.
			if lerr := c.lost(); lerr != nil {
				err = fmt.Errorf("%w: %w", ErrLost, lerr)
			} else {
				err = fmt.Errorf("the server closed the channel: %w", io.ErrClosedPipe)
			}
		}
		c.werr = err
		close(c.wdone)
	}
	write := func(b wchunk) bool {
		_, err := c.ch.Write(b.buf[:b.n])
		writeBufs.Put(b.buf)
		<-c.wtokens
		if err != nil {
			fail(err)
			return false
		}
		return true
	}
	for {
		select {
		case b := <-c.wq:
			if !write(b) {
				c.finish()
				return
			}
			continue
		default:
		}
		select {
		case b := <-c.wq:
			if !write(b) {
				c.finish()
				return
			}
		case <-c.shut:
			// Everything handed over before CloseWrite is in wq or
			// written: send it, then the EOF.
			for len(c.wq) > 0 {
				if !write(<-c.wq) {
					c.finish()
					return
				}
			}
			if err := c.ch.CloseWrite(); err != nil {
				fail(err)
			} else {
				fail(errShutdown)
			}
			<-c.closed
			c.finish()
			return
		case <-c.closed:
			// Close: send what was accepted, then close the channel.
			for len(c.wq) > 0 {
				if !write(<-c.wq) {
					break
				}
			}
			c.finish()
			return
		}
	}
}

// A wchunk is data handed to the writer.
type wchunk struct {
	buf *[writeChunk]byte
	n   int
}

// errShutdown is the write error after CloseWrite.
var errShutdown = errors.New("write after CloseWrite")

// finish closes the channel once the conn is closed, and runs done.
func (c *conn) finish() {
	<-c.closed
	c.ch.Close()
	if c.done != nil {
		c.done()
	}
}

func (c *conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "ssh", Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read reads what the channel received. It returns io.EOF at the end of
// the stream, and an error matching ErrLost if the SSH connection broke.
func (c *conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	select {
	case <-c.closed:
		return 0, c.opErr("read", net.ErrClosed)
	default:
	}
	if c.rdl.Exceeded() {
		return 0, c.opErr("read", os.ErrDeadlineExceeded)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.rcur) == 0 {
		if c.rbuf != nil {
			c.rfree <- c.rbuf[:cap(c.rbuf)]
			c.rbuf = nil
		}
		select {
		case b := <-c.rq:
			c.rbuf, c.rcur = b, b
		case <-c.rdone:
			select {
			case b := <-c.rq: // read before the end
				c.rbuf, c.rcur = b, b
			default:
				if c.rerr == io.EOF {
					return 0, io.EOF
				}
				return 0, c.opErr("read", c.rerr)
			}
		case <-c.rdl.Done():
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		case <-c.closed:
			return 0, c.opErr("read", net.ErrClosed)
		}
	}
	n := copy(p, c.rcur)
	c.rcur = c.rcur[n:]
	return n, nil
}

// Write hands p to the writer, blocking while it still holds two chunks.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for {
		if len(p) == 0 {
			return n, c.writable()
		}
		if err := c.writeSlot(); err != nil {
			return n, err
		}
		buf := writeBufs.Get().(*[writeChunk]byte)
		m := copy(buf[:], p)
		c.wq <- wchunk{buf, m} // never blocks: a token is held for each chunk, wq holds two
		n += m
		p = p[m:]
	}
}

// ReadFrom reads r straight into write-behind chunks, sparing Write's
// copy. netconn.Relay calls it with an *io.LimitedReader of the bytes
// queued on a socket, which a read returns without blocking: a chunk
// then takes all of them, up to writeChunk, where a relay's Write would
// hand over 32 KiB at a time, so the writer wakes less often too. Other
// readers go through Write: a chunk is held while Read blocks, and an
// idle relay must hold no write buffer. (A program that passes an
// io.LimitedReader over a source that blocks holds one chunk meanwhile.)
func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	if _, ok := r.(*io.LimitedReader); !ok {
		return io.Copy(writerOnly{c}, r)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var n int64
	for {
		if err := c.writeSlot(); err != nil {
			return n, err
		}
		buf := writeBufs.Get().(*[writeChunk]byte)
		m, err := r.Read(buf[:])
		if m > 0 {
			c.wq <- wchunk{buf, m}
			n += int64(m)
		} else {
			writeBufs.Put(buf)
			<-c.wtokens
		}
		switch {
		case err == io.EOF:
			return n, nil
		case err != nil:
			return n, err
		}
	}
}

// writerOnly hides conn's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// writable returns why nothing more can be written, or nil.
func (c *conn) writable() error {
	select {
	case <-c.closed:
		return c.opErr("write", net.ErrClosed)
	case <-c.wdone:
		return c.opErr("write", c.werr)
	default:
	}
	if c.wantShut {
		return c.opErr("write", errShutdown)
	}
	if c.wdl.Exceeded() {
		return c.opErr("write", os.ErrDeadlineExceeded)
	}
	return nil
}

// writeSlot waits until the writer can take one more chunk and takes its
// token, or returns why nothing more can be written.
func (c *conn) writeSlot() error {
	if err := c.writable(); err != nil {
		return err
	}
	select {
	case c.wtokens <- struct{}{}:
		return nil
	case <-c.closed:
		return c.opErr("write", net.ErrClosed)
	case <-c.wdone:
		return c.opErr("write", c.werr)
	case <-c.wdl.Done():
		return c.opErr("write", os.ErrDeadlineExceeded)
	}
}

// CloseWrite sends the channel's EOF once what was written is sent: the
// peer reads the end of the stream, and this side can still read.
func (c *conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.closed:
		return c.opErr("close", net.ErrClosed)
	default:
	}
	c.wantShut = true
	c.shutOnce.Do(func() { close(c.shut) })
	return nil
}

// Close closes the connection: blocked and later calls fail with
// net.ErrClosed at once. What Write accepted is still sent, for at most
// flushTimeout, before the channel closes.
func (c *conn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = nil
		close(c.closed)
		t := time.AfterFunc(flushTimeout, func() { c.ch.Close() })
		go func() {
			<-c.writerGone
			t.Stop()
		}()
	})
	if err != nil {
		return c.opErr("close", err)
	}
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.laddr }
func (c *conn) RemoteAddr() net.Addr { return c.raddr }

func (c *conn) SetDeadline(t time.Time) error {
	c.rdl.Set(t)
	c.wdl.Set(t)
	return nil
}

func (c *conn) SetReadDeadline(t time.Time) error  { c.rdl.Set(t); return nil }
func (c *conn) SetWriteDeadline(t time.Time) error { c.wdl.Set(t); return nil }

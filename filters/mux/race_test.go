package mux

import (
	"bytes"
	"io"
	"net"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/xtaci/smux"
)

// TestLastFrameRace replays, deterministically, the interleaving in which
// smux v1.5.58 ends a half-closed stream without its last frame: a Read
// finds the stream's buffer empty and lets go of the buffer's lock; the
// session then buffers the peer's last frame and handles the FIN behind
// it, which ends the stream (both sides have sent their FIN); the Read,
// resumed, sees the end and reports io.EOF with that frame unread
// (smux's stream.go, tryReadV2: the buffer is looked at under bufferLock,
// the end after it). Without stream.readBelow's second look, the reader
// loses the last bytes and their end record: ErrAborted instead of the
// peer's bytes.
//
// The Read is made to pause at that very point by the runtime's mutex
// hand-off: in starvation mode, sync.Mutex.Unlock hands the lock to the
// first waiter and yields the processor to it. With one processor, the
// reader holds bufferLock (reading an empty buffer) while smux's receive
// loop, starving, waits for it to buffer the peer's frame: the reader's
// Unlock runs the receive loop through the frame and the FIN before the
// reader looks at the stream's end. The test reaches into smux's stream
// for bufferLock and into sync.Mutex for its state; it fails, saying
// so, if either has moved.
//
// WriteTo meets the same interleaving, and ends right: smux's writeToV2
// waits for the end under the lock that guards the buffer.
func TestLastFrameRace(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	want := []byte("the last bytes")
	for _, how := range []string{"Read", "WriteTo"} {
		t.Run(how, func(t *testing.T) {
			conn := newScriptConn()
			sess, err := smux.Server(newSessionConn(conn), Config{}.withDefaults().smux())
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			const sid = 3
			conn.feed(smuxFrame(cmdSYN, sid, nil))
			st, err := sess.AcceptStream()
			if err != nil {
				t.Fatal(err)
			}
			s := newStream(st)
			defer s.Close()
			// The reader's side is done writing, and has sent smux's FIN:
			// the peer's FIN will end the stream. CloseWrite sends smux's
			// FIN only after a Write failed (its end record and FIN wait
			// for Close otherwise: frame.go), and then the peer's last
			// bytes may still come; the test sends it itself.
			if err := s.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			<-s.tail
			if err := st.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			mu := bufferLock(t, st)

			mu.Lock()
			type result struct {
				got []byte
				err error
			}
			done := make(chan result, 1)
			go func() {
				var got bytes.Buffer
				var err error
				if how == "Read" {
					_, err = io.CopyBuffer(&got, struct{ io.Reader }{s}, make([]byte, 512))
				} else {
					_, err = s.WriteTo(&got)
				}
				done <- result{got.Bytes(), err}
			}()
			waitMutex(t, mu, "the reader to wait for bufferLock", func(m int32) bool { return m>>mutexWaiterShift == 1 })
			waitStart := time.Now()
			// The peer's last frame (its bytes and the end record), then
			// its FIN: the receive loop waits for bufferLock to buffer the
			// frame, the FIN behind it already read.
			conn.feed(append(smuxFrame(cmdPSH, sid, append(record(want), endRecord...)), smuxFrame(cmdFIN, sid, nil)...))
			waitMutex(t, mu, "the receive loop to wait for bufferLock", func(m int32) bool { return m>>mutexWaiterShift == 2 })
			// The reader has waited for longer than starvationThresholdNs
			// (1 ms): woken and finding the lock taken again, it puts the
			// mutex in starvation mode, first in line.
			time.Sleep(2*time.Millisecond - time.Since(waitStart))
			mu.Unlock()
			mu.Lock()
			waitMutex(t, mu, "starvation mode", func(m int32) bool { return m&mutexStarving != 0 && m>>mutexWaiterShift == 2 })
			// Hand bufferLock to the reader, which hands it on to the
			// receive loop.
			mu.Unlock()

			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the reader is still reading after 10s")
			}
			if r.err != nil || !bytes.Equal(r.got, want) {
				t.Fatalf("%s read %q, then %v; the peer sent %q, then its end record and its FIN", how, r.got, r.err, want)
			}
		})
	}
}

// record is data as one record.
func record(data []byte) []byte {
	b := make([]byte, headerSize, headerSize+len(data))
	putHeader(b, len(data))
	return append(b, data...)
}

// smuxFrame is a frame of smux's protocol version 2.
func smuxFrame(cmd byte, sid uint32, data []byte) []byte {
	b := []byte{2, cmd, byte(len(data)), byte(len(data) >> 8), byte(sid), byte(sid >> 8), byte(sid >> 16), byte(sid >> 24)}
	return append(b, data...)
}

// sync.Mutex's state word (internal/sync/mutex.go, Go 1.24 and later).
const (
	mutexStarving    = 4
	mutexWaiterShift = 3
)

// bufferLock returns the mutex that guards st's receive buffer.
func bufferLock(t *testing.T, st *smux.Stream) *sync.Mutex {
	t.Helper()
	inner := reflect.ValueOf(st).Elem().Field(0) // the embedded *smux.stream
	f := inner.Elem().FieldByName("bufferLock")
	if !f.IsValid() || f.Type() != reflect.TypeFor[sync.Mutex]() {
		t.Fatal("smux's stream has no bufferLock any more: read smux's stream.go again and update this test")
	}
	return (*sync.Mutex)(unsafe.Pointer(f.UnsafeAddr()))
}

// waitMutex waits until mu's state satisfies ok, letting the other
// goroutines run.
func waitMutex(t *testing.T, mu *sync.Mutex, what string, ok func(state int32) bool) {
	t.Helper()
	state := (*int32)(unsafe.Pointer(mu)) // the first word of a sync.Mutex
	for deadline := time.Now().Add(5 * time.Second); !ok(atomic.LoadInt32(state)); {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: sync.Mutex's state is %#x: has its layout or its starvation mode changed?", what, atomic.LoadInt32(state))
		}
		runtime.Gosched()
	}
}

// scriptConn is the connection under a session, fed by the test: a Read
// returns what was fed at once, without a goroutine switch, and blocks
// only when there is nothing. Writes are dropped.
type scriptConn struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	closed bool
}

func newScriptConn() *scriptConn {
	c := &scriptConn{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *scriptConn) feed(b []byte) {
	c.mu.Lock()
	c.buf = append(c.buf, b...)
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) == 0 && !c.closed {
		c.cond.Wait()
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return len(p), nil
}

func (c *scriptConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cond.Broadcast()
	return nil
}

func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

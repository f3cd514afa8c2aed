package mux

import (
	"io"
	"net"
	"testing"
	"time"
)

// junk is a layer.Junction for the fuzz target: it drains every stream
// the session delivers.
type junk struct{ done chan struct{} }

func (j junk) Deliver(c net.Conn) error {
	go func() {
		c.SetDeadline(time.Now().Add(time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}()
	return nil
}
func (j junk) State(string, func() any) any { return nil }
func (j junk) Done() <-chan struct{}        { return j.done }
func (j junk) Timeout() time.Duration       { return time.Second }
func (j junk) MaxPending() int              { return 16 }
func (j junk) RemoteAddr() net.Addr         { return nil }

// FuzzSession feeds arbitrary bytes to the listening side of a session:
// smux's frame decoder and our stream wrapper must fail cleanly, never
// panic or hang.
func FuzzSession(f *testing.F) {
	// A SYN, a PSH with data and a FIN for stream 3, in version 2 frames.
	frame := func(cmd byte, sid uint32, data []byte) []byte {
		b := []byte{2, cmd, byte(len(data)), byte(len(data) >> 8), byte(sid), byte(sid >> 8), byte(sid >> 16), byte(sid >> 24)}
		return append(b, data...)
	}
	var seed []byte
	seed = append(seed, frame(0, 3, nil)...)          // SYN
	seed = append(seed, frame(2, 3, []byte("hi"))...) // PSH
	seed = append(seed, frame(1, 3, nil)...)          // FIN
	f.Add(seed)
	f.Add(frame(2, 5, []byte("data for a stream never opened")))
	f.Add([]byte{9, 9, 9, 9, 9, 9, 9, 9})
	f.Add(frame(0, 3, nil)[:5])
	f.Fuzz(func(t *testing.T, data []byte) {
		near, far := net.Pipe()
		l, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		j := junk{done: make(chan struct{})}
		defer close(j.done)
		if err := l.Accept(near, j); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, far)
		far.SetWriteDeadline(time.Now().Add(time.Second))
		far.Write(data)
		far.Close()
	})
}

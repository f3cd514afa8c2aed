package vio_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vio"
)

// FuzzSet drives a Set through random sequences of posts, closes, waits,
// wakeups and peer actions on two in-memory connections, and checks the
// state machine against a model: a post is taken or refused as the
// model says (busy, closed); every event answers a post the model holds
// open, and a close's only once the Sock's read and write completed;
// reads deliver the peer's bytes in order; and Close returns, whatever
// is left posted.
func FuzzSet(f *testing.F) {
	f.Add([]byte{0, 3, 4, 4, 1, 4, 2, 4, 4})
	f.Add([]byte{0, 1, 2, 4, 4, 4, 0, 1})
	f.Add([]byte{3, 3, 0, 4, 0, 4, 6, 0, 4, 5, 4})
	f.Add([]byte{8, 11, 9, 13, 12, 10, 4, 12, 12})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		s := vio.NewSet()
		type model struct {
			k    *vio.Sock
			peer net.Conn
			feed chan int // byte counts for the peer's writer
			// reads are the buffers of the reads posted whose events
			// Wait has not returned, oldest first; writes counts the
			// writes. A completion frees its kind before Wait returns
			// it, so a post may be taken while the model still holds
			// one; ErrBusy needs one held.
			reads           [][]byte
			writes          int
			shut, closeDone bool
			next            byte // the next byte the peer's sequence holds
		}
		var ms [2]*model
		for i := range ms {
			a, b := net.Pipe()
			k, err := s.Add(a, i)
			if err != nil {
				t.Fatal(err)
			}
			m := &model{k: k, peer: b, feed: make(chan int, 64)}
			ms[i] = m
			go func() { io.Copy(io.Discard, b) }() // the peer reads all we write
			go func() {
				var seq byte
				for n := range m.feed {
					p := make([]byte, n)
					for j := range p {
						p[j] = seq
						seq++
					}
					if _, err := b.Write(p); err != nil {
						return
					}
				}
			}()
		}
		woken := false
		check := func(ev vio.Event) {
			m := ms[ev.Sock.User.(int)]
			switch ev.Op {
			case vio.OpRead:
				if len(m.reads) == 0 {
					t.Fatalf("a read completed that was not posted")
				}
				buf := m.reads[0]
				m.reads = m.reads[1:]
				if ev.Err == nil {
					for _, c := range buf[:ev.N] {
						if c != m.next {
							t.Fatalf("read byte %d, want %d: out of order", c, m.next)
						}
						m.next++
					}
				}
			case vio.OpWrite:
				if m.writes == 0 {
					t.Fatalf("a write completed that was not posted")
				}
				m.writes--
			case vio.OpClose:
				if !m.shut || m.closeDone || len(m.reads) > 0 || m.writes > 0 {
					t.Fatalf("a close completed: shut %v, done before %v, reads open %d, writes open %d", m.shut, m.closeDone, len(m.reads), m.writes)
				}
				m.closeDone = true
			}
		}
		for i, op := range ops {
			m := ms[int(op>>3)&1]
			arg := 1
			if i+1 < len(ops) {
				arg = 1 + int(ops[i+1]%16)
			}
			switch op & 7 {
			case 0:
				buf := make([]byte, arg)
				err := m.k.PostRead(buf, 1+arg/2, nil)
				switch {
				case m.shut:
					if !errors.Is(err, net.ErrClosed) {
						t.Fatalf("read posted after close: %v", err)
					}
				case errors.Is(err, vio.ErrBusy):
					if len(m.reads) == 0 {
						t.Fatalf("a read refused as busy with none posted")
					}
				case err != nil:
					t.Fatalf("read: %v", err)
				default:
					m.reads = append(m.reads, buf)
				}
			case 1:
				err := m.k.PostWrite(make([]byte, arg), nil)
				switch {
				case m.shut:
					if !errors.Is(err, net.ErrClosed) {
						t.Fatalf("write posted after close: %v", err)
					}
				case errors.Is(err, vio.ErrBusy):
					if m.writes == 0 {
						t.Fatalf("a write refused as busy with none posted")
					}
				case err != nil:
					t.Fatalf("write: %v", err)
				default:
					m.writes++
				}
			case 2:
				err := m.k.PostClose()
				if m.shut != (err != nil) {
					t.Fatalf("close (closed before: %v): %v", m.shut, err)
				}
				m.shut = true
			case 3:
				if !m.shut {
					m.feed <- arg
				}
			case 4, 7:
				wait := time.Duration(0) // 4 only looks; 7 gives what is posted a moment
				if op&7 == 7 {
					wait = 100 * time.Microsecond
				}
				ev, err := s.Wait(wait)
				switch {
				case errors.Is(err, vio.ErrWoken):
					if !woken {
						t.Fatalf("woken without a Wakeup")
					}
					woken = false
				case errors.Is(err, vio.ErrTimeout):
				case err != nil:
					t.Fatalf("Wait: %v", err)
				default:
					check(ev)
				}
			case 5:
				s.Wakeup()
				woken = true
			case 6:
				m.peer.Close()
			}
		}
		done := make(chan error)
		go func() { done <- s.Close() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Close hung")
		}
		for _, m := range ms {
			close(m.feed)
			m.peer.Close()
		}
	})
}

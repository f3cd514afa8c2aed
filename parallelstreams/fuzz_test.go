package parallelstreams

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzJoin: any 24 bytes either decode to a join header that re-encodes
// to themselves, or are refused with ErrProtocol.
func FuzzJoin(f *testing.F) {
	good := (&join{index: 1, count: 4, max: 8, id: sessionID{1, 2, 3}}).marshal()
	f.Add(good[:])
	f.Add(make([]byte, joinSize))
	bad := good
	bad[0] = 9
	f.Add(bad[:])
	f.Fuzz(func(t *testing.T, data []byte) {
		var b [joinSize]byte
		copy(b[:], data)
		j, err := parseJoin(&b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not match ErrProtocol", err)
			}
			return
		}
		if again := j.marshal(); again != b {
			t.Fatalf("join %+v re-encodes to %x, was %x", j, again, b)
		}
	})
}

// FuzzBlocks feeds arbitrary bytes to a session as what its one substream
// receives. The session must deliver in-order data or fail with an
// error, never panic, and never hold more than its window.
func FuzzBlocks(f *testing.F) {
	var h header
	block := func(t blockType, seq uint64, payload []byte) []byte {
		h.set(t, len(payload), seq)
		return append(append([]byte(nil), h[:]...), payload...)
	}
	f.Add(bytes.Join([][]byte{block(blockData, 0, []byte("hello")), block(blockFin, 1, nil)}, nil))
	f.Add(bytes.Join([][]byte{block(blockData, 1, []byte("world")), block(blockData, 0, []byte("hello ")), block(blockFin, 2, nil)}, nil))
	f.Add(block(blockData, 0, []byte("x"))[:10]) // truncated header
	f.Add(block(blockData, 0, make([]byte, 100))[:50])
	f.Add(bytes.Join([][]byte{block(blockData, 0, []byte("a")), block(blockData, 0, []byte("a"))}, nil))
	f.Add(block(blockCredit, 1<<40, nil))
	f.Add(bytes.Join([][]byte{block(blockFin, 0, nil), block(blockData, 0, []byte("late"))}, nil))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		near, far := net.Pipe()
		defer far.Close()
		s := newSession(sessionID{}, 256<<10, time.Second, []net.Conn{near})
		defer s.Close()
		go io.Copy(io.Discard, far) // credit the session sends
		go func() {
			far.Write(data)
			far.Close()
		}()
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(s)
		s.mu.Lock()
		held := s.buffered
		s.mu.Unlock()
		if held > 256<<10+MaxBlock+blockCost {
			t.Fatalf("session holds %d bytes", held)
		}
		if err == nil {
			// A clean end needs the fin: the data must then be what the
			// blocks said, in order.
			if !s.finRecv {
				t.Fatalf("clean end without a fin, %d bytes", len(got))
			}
		}
	})
}

package parallelstreams

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
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
// receives, and reads the session both ways (Read and WriteTo). The
// session must deliver exactly the stream the blocks spell, or fail with
// an error having delivered a prefix of it; never end cleanly on an
// incomplete stream, panic, or hold more than its window.
func FuzzBlocks(f *testing.F) {
	var h header
	block := func(t blockType, seq uint64, payload []byte) []byte {
		h.set(t, len(payload), seq)
		return append(append([]byte(nil), h[:]...), payload...)
	}
	blocks := func(b ...[]byte) []byte { return bytes.Join(b, nil) }
	f.Add(blocks(block(blockData, 0, []byte("hello")), block(blockFin, 1, nil)))
	f.Add(blocks(block(blockData, 1, []byte("world")), block(blockData, 0, []byte("hello ")), block(blockFin, 2, nil)))
	f.Add(blocks(block(blockData, 1, []byte("world")), block(blockFin, 2, nil), block(blockData, 0, []byte("hello "))))
	f.Add(blocks(block(blockData, 2, bytes.Repeat([]byte("c"), 50)), block(blockData, 0, bytes.Repeat([]byte("a"), 50)),
		block(blockCredit, 7, nil), block(blockData, 1, bytes.Repeat([]byte("b"), 50)), block(blockFin, 3, nil)))
	f.Add(block(blockData, 0, []byte("x"))[:10]) // truncated header
	f.Add(block(blockData, 0, make([]byte, 100))[:50])
	f.Add(blocks(block(blockData, 0, []byte("a")), block(blockData, 0, []byte("a"))))
	f.Add(blocks(block(blockData, 0, []byte("a")), block(blockData, 2, []byte("c")), block(blockFin, 3, nil))) // a gap
	f.Add(block(blockCredit, 1<<40, nil))
	f.Add(blocks(block(blockFin, 0, nil), block(blockData, 0, []byte("late"))))
	f.Add(blocks(block(blockData, math.MaxUint64, []byte("lost")), block(blockFin, 0, nil)))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	const window = 256 << 10
	f.Fuzz(func(t *testing.T, data []byte) {
		want, complete, cost := expectBlocks(data)
		for _, how := range []string{"Read", "WriteTo"} {
			s := newSession(sessionID{}, window, time.Second, []net.Conn{&scriptConn{r: bytes.NewReader(data)}})
			// The substream never blocks, so the session ends or fails
			// at once; the deadline only catches a hang.
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			var got []byte
			var err error
			if how == "Read" {
				got, err = io.ReadAll(s)
			} else {
				var b bytes.Buffer
				_, err = s.WriteTo(&b)
				got = b.Bytes()
			}
			s.mu.Lock()
			held := s.buffered
			s.mu.Unlock()
			s.Close()
			if held > window+MaxBlock+blockCost {
				t.Fatalf("%s: session holds %d bytes", how, held)
			}
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("%s: the session neither ended nor failed", how)
			case err == nil && !complete:
				t.Fatalf("%s: clean end after %d bytes, but the blocks make no complete stream", how, len(got))
			case err == nil && !bytes.Equal(got, want):
				t.Fatalf("%s: delivered %d bytes, differing from the %d sent at %d", how, len(got), len(want), firstDiff(got, want))
			case err != nil && !bytes.HasPrefix(want, got):
				t.Fatalf("%s: delivered %d bytes that are not a prefix of the %d sent (differ at %d), then: %v",
					how, len(got), len(want), firstDiff(got, want), err)
			case err != nil && complete && cost <= window+MaxBlock+blockCost:
				// Within the window no reading pace makes the session
				// refuse a block, so a complete stream must get through.
				t.Fatalf("%s: a complete stream of %d bytes failed after %d: %v", how, len(want), len(got), err)
			}
		}
	})
}

// expectBlocks decodes data as the blocks the protocol defines (frame.go),
// independently of the session's code, up to the first thing the protocol
// forbids. It returns the stream they spell (the payloads in sequence
// order, as far as they run without a gap); whether it is complete (a fin
// with every block before it present: the rest of data cannot change what
// is read); and the window the session needs to get there.
func expectBlocks(data []byte) (want []byte, complete bool, cost int64) {
	payloads := map[uint64][]byte{}
	var (
		top, finSeq uint64 // largest data block number; the fin's
		anyData     bool
		fin         bool
	)
decode:
	for !complete && len(data) >= headerSize {
		h := data[:headerSize]
		data = data[headerSize:]
		n, seq := int(binary.BigEndian.Uint32(h[4:])), binary.BigEndian.Uint64(h[8:])
		if h[1]|h[2]|h[3] != 0 {
			break
		}
		switch blockType(h[0]) {
		case blockData:
			if n == 0 || n > MaxBlock || len(data) < n {
				break decode
			}
			p := data[:n]
			data = data[n:]
			if _, dup := payloads[seq]; dup || fin && seq >= finSeq {
				break decode
			}
			payloads[seq] = p
			cost += int64(n) + blockCost
			if !anyData || seq > top {
				top = seq
			}
			anyData = true
		case blockFin:
			if n != 0 || fin || anyData && seq <= top {
				break decode
			}
			fin, finSeq = true, seq
		case blockCredit:
			if n != 0 {
				break decode
			}
		default:
			break decode
		}
		// Every data block is numbered below the fin, and none twice.
		complete = fin && uint64(len(payloads)) == finSeq
	}
	for i := uint64(0); ; i++ {
		p, ok := payloads[i]
		if !ok {
			break
		}
		want = append(want, p...)
	}
	return want, complete, cost
}

func firstDiff(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// scriptConn is a substream whose peer sent data and closed, and which
// swallows what the session sends (credit). Unlike a pipe it never
// blocks, so how the session ends depends on data alone.
type scriptConn struct {
	mu     sync.Mutex
	r      *bytes.Reader
	closed bool
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
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
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *scriptConn) LocalAddr() net.Addr              { return nil }
func (c *scriptConn) RemoteAddr() net.Addr             { return nil }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

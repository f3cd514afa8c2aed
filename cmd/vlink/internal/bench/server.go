package bench

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// Request bytes: the first byte a bench client sends says what it wants.
const (
	modeDrain = 'D' // read to EOF, answer the count as 8 bytes big endian
	modeEcho  = 'E' // echo everything back
)

// benchServers are the servers a bench measures against: raw TCP and a
// VLink listener, each counting the bytes it reads from the wire.
type benchServers struct {
	raw     net.Listener
	vl      *vlink.Listener
	key     []byte // the listener's, and every bench dialer's: layers such as noise need one
	rawWire atomic.Int64
	vlWire  atomic.Int64

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startBenchServers() (*benchServers, error) {
	s := &benchServers{conns: map[net.Conn]struct{}{}, key: make([]byte, 32)}
	rand.Read(s.key)
	rawL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.raw = &countingListener{Listener: rawL, n: &s.rawWire}
	vlL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		rawL.Close()
		return nil, err
	}
	// Every registered filter and multi-link layer, plain stacks too; the
	// key lets the ones that need one (noise) run.
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: s.key, Plain: vlink.PlainAllow}}
	if s.vl, err = lc.NewListener(&countingListener{Listener: vlL, n: &s.vlWire}); err != nil {
		rawL.Close()
		vlL.Close()
		return nil, err
	}
	for _, l := range []net.Listener{s.raw, s.vl} {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.conns[c] = struct{}{}
				s.mu.Unlock()
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					serveBench(c)
					s.mu.Lock()
					delete(s.conns, c)
					s.mu.Unlock()
				}()
			}
		}()
	}
	return s, nil
}

// waitIdle waits, for up to a few seconds, until every connection the
// servers accepted has ended.
func (s *benchServers) waitIdle() {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return
		}
	}
}

func (s *benchServers) close() {
	s.raw.Close()
	s.vl.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// serveBench answers one bench connection: drain or echo.
func serveBench(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(benchIOTimeout))
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	switch mode[0] {
	case modeDrain:
		// Read with a plain loop, not io.Copy, so that every stack is read
		// the same way, through the same buffer size.
		buf := make([]byte, 2*benchChunk)
		var n int64
		for {
			m, err := c.Read(buf)
			n += int64(m)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return
			}
		}
		var ack [8]byte
		binary.BigEndian.PutUint64(ack[:], uint64(n))
		c.Write(ack[:])
	case modeEcho:
		buf := make([]byte, 4<<10)
		for {
			m, err := c.Read(buf)
			if m > 0 {
				if _, werr := c.Write(buf[:m]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

// countingListener counts the bytes read from the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: l.n}, nil
}

// countingConn counts the bytes read from it. It keeps half-close, which
// the bench's protocol relies on.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

var _ netconn.CloseWriter = (*countingConn)(nil)

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingConn) CloseWrite() error { return netconn.CloseWrite(c.Conn) }

package testnet

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// A FlightRecorder is a TCP relay to a target, on loopback, that
// records what it carries as flights, to count a protocol's round trips.
type FlightRecorder struct {
	Addr  string // where to dial
	mu    sync.Mutex
	conns [][]Flight // each connection's, in the order accepted
}

// A Flight is a run of bytes one side sent before the other answered.
type Flight struct {
	Up    bool // dialer to listener
	Bytes []byte
}

// NewFlightRecorder starts one, stopped when the test ends (Listen).
func NewFlightRecorder(tb testing.TB, target string) *FlightRecorder {
	tb.Helper()
	fr := &FlightRecorder{}
	fr.Addr = Listen(tb, func(c net.Conn) {
		u, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer u.Close()
		fr.mu.Lock()
		i := len(fr.conns)
		fr.conns = append(fr.conns, nil)
		fr.mu.Unlock()
		// Each direction ends on its own, the other going on.
		up := make(chan struct{})
		go func() { defer close(up); fr.copy(u, c, i, true) }()
		fr.copy(c, u, i, false)
		<-up
	})
	return fr
}

// copy carries src to dst, recording it as connection i's, until src
// ends or dst fails, then ends dst's writing side.
func (fr *FlightRecorder) copy(dst, src net.Conn, i int, up bool) {
	defer dst.(*net.TCPConn).CloseWrite()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			fr.record(i, up, buf[:n])
		}
		if _, werr := dst.Write(buf[:n]); err != nil || werr != nil {
			return
		}
	}
}

func (fr *FlightRecorder) record(i int, up bool, b []byte) {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	fl := fr.conns[i]
	if n := len(fl); n > 0 && fl[n-1].Up == up {
		fl[n-1].Bytes = append(fl[n-1].Bytes, b...)
		return
	}
	fr.conns[i] = append(fl, Flight{Up: up, Bytes: bytes.Clone(b)})
}

// All returns every byte carried so far, both ways.
func (fr *FlightRecorder) All() []byte {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	var b []byte
	for _, fl := range fr.conns {
		for _, f := range fl {
			b = append(b, f.Bytes...)
		}
	}
	return b
}

// Flights returns the flights so far of the i-th connection.
func (fr *FlightRecorder) Flights(i int) []Flight {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if i >= len(fr.conns) {
		return nil
	}
	return append([]Flight(nil), fr.conns[i]...)
}

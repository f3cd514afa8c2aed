// Package testnet holds the loopback servers and checks the project's
// tests share: an accept loop that a test's cleanup stops and waits for,
// an echo server, a SHA-256-checked echo round trip, loopback TCP pairs,
// seeded random bytes and their sums, a process's RSS and descriptors
// (Linux), scrapes of a --metrics endpoint, and a relay that counts a
// protocol's flights. It is imported by tests only.
package testnet

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// handlerGrace is how long a test's cleanup waits for Serve's handlers
// before it closes their connections and fails the test.
var handlerGrace = 20 * time.Second

// Serve runs handle on every connection l accepts, each in its own
// goroutine, closing the connection when handle returns. The test's
// cleanup closes l and waits for every handler, so a test that ends
// leaves nothing running. A handler still blocked then is woken by
// closing its connection: at once if the test has failed (a t.Fatal
// that left a client open must not hang the run until its timeout),
// else after handlerGrace, and the test fails for the leak.
func Serve(tb testing.TB, l net.Listener, handle func(net.Conn)) {
	tb.Helper()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	}
	tb.Cleanup(func() {
		l.Close()
		if tb.Failed() {
			closeAll()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(handlerGrace):
			tb.Errorf("testnet.Serve: a handler for %s still ran %v after the test; closing its connection", l.Addr(), handlerGrace)
			closeAll()
			<-done
		}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				handle(c)
			}()
		}
	}()
}

// Listen returns a TCP listener on a free loopback port, served by
// handle (see Serve), and its address.
func Listen(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	Serve(tb, l, handle)
	return l.Addr().String()
}

// Echo sends back what c sends until c half-closes, then half-closes
// back.
func Echo(c net.Conn) {
	io.Copy(c, c)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// EchoServer starts an echo server (see Echo) on loopback and returns its
// address.
func EchoServer(tb testing.TB) string {
	tb.Helper()
	return Listen(tb, Echo)
}

// RoundTrip sends size pseudo-random bytes through c to an echo, half-
// closes, and checks that the same bytes come back (by SHA-256), within
// 30 seconds.
func RoundTrip(tb testing.TB, c net.Conn, size int) {
	tb.Helper()
	if err := Echoed(c, size); err != nil {
		tb.Fatal(err)
	}
}

// Echoed is RoundTrip for any goroutine: it returns what went wrong.
func Echoed(c net.Conn, size int) error {
	data := RandomBytes(size, uint64(size))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		return fmt.Errorf("echo of %d bytes came back as %d different bytes", size, len(got))
	}
	return nil
}

// UDPEcho starts a UDP server on loopback that answers every datagram
// with itself, until the test ends, and returns its address.
func UDPEcho(tb testing.TB) netip.AddrPort {
	tb.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// A Buffer collects a process's or a logger's output, written from any
// goroutine, for the test to search.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

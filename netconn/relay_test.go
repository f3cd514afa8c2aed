package netconn

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// delegating is a wrapper whose WriteTo, ReadFrom and CloseWrite hand
// over to the *net.TCPConn below, as a thin filter would.
type delegating struct {
	net.Conn
	tc *net.TCPConn
}

func (c delegating) WriteTo(w io.Writer) (int64, error)  { return c.tc.WriteTo(w) }
func (c delegating) ReadFrom(r io.Reader) (int64, error) { return c.tc.ReadFrom(r) }
func (c delegating) CloseWrite() error                   { return c.tc.CloseWrite() }
func (c delegating) NetConn() net.Conn                   { return c.tc }

// hidden shows nothing but net.Conn and CloseWrite: no zero-copy path
// (splice(2)), no WriterTo, so relays copy through user space. Like a
// filter, it names the connection below (NetConn), which Abort resets.
type hidden struct{ net.Conn }

func (c hidden) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }
func (c hidden) NetConn() net.Conn { return c.Conn }

// bare shows nothing but net.Conn and NetConn: no half-close either.
type bare struct{ net.Conn }

func (c bare) NetConn() net.Conn { return c.Conn }

type wrap func(net.Conn) net.Conn

var (
	asIs        wrap = func(c net.Conn) net.Conn { return c }
	asDelegate  wrap = func(c net.Conn) net.Conn { return delegating{c, c.(*net.TCPConn)} }
	asHidden    wrap = func(c net.Conn) net.Conn { return hidden{c} }
	asBare      wrap = func(c net.Conn) net.Conn { return bare{c} }
	relayShapes      = []struct {
		name         string
		wrapA, wrapB wrap
	}{
		{"tcp-tcp", asIs, asIs},                     // zero-copy both ways
		{"delegating", asDelegate, asDelegate},      // WriteTo -> ReadFrom -> zero-copy
		{"tcp-delegating", asIs, asDelegate},        // chunked zero-copy into a ReaderFrom; WriteTo back
		{"tcp-hidden", asIs, asHidden},              // poll path one way, pooled buffer back
		{"hidden-hidden", asHidden, asHidden},       // pooled buffer both ways
		{"delegating-hidden", asDelegate, asHidden}, // WriteTo into a plain writer
	}
)

type relayResult struct {
	aToB, bToA int64
	err        error
}

// relayed is client <-> a [Relay] b <-> server over loopback TCP.
type relayed struct {
	client, server net.Conn
	a, b           net.Conn
	rawB           *net.TCPConn // b before wrapping
	done           chan relayResult
}

func startRelay(t testing.TB, wrapA, wrapB wrap) *relayed {
	t.Helper()
	front := listen(t)
	back := listen(t)
	r := &relayed{done: make(chan relayResult, 1)}
	r.client, r.a = connect(t, front)
	r.b, r.server = connect(t, back)
	front.Close()
	back.Close()
	r.rawB = r.b.(*net.TCPConn)
	r.a, r.b = wrapA(r.a), wrapB(r.b)
	go func() {
		var res relayResult
		res.aToB, res.bToA, res.err = Relay(r.a, r.b)
		r.done <- res
	}()
	t.Cleanup(func() { r.client.Close(); r.server.Close() })
	return r
}

func (r *relayed) wait(t testing.TB) relayResult {
	t.Helper()
	select {
	case res := <-r.done:
		return res
	case <-time.After(20 * time.Second):
		t.Fatal("Relay did not return")
		return relayResult{}
	}
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// connect dials ln and returns both ends.
func connect(t testing.TB, ln net.Listener) (dialed, accepted net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); ch <- c }()
	dialed, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted = <-ch
	if accepted == nil {
		t.Fatal("accept failed")
	}
	return dialed, accepted
}

// send writes data and half-closes; it reports a write error on errc.
func send(c net.Conn, data []byte, errc chan<- error) {
	_, err := c.Write(data)
	if err == nil {
		err = c.(*net.TCPConn).CloseWrite()
	}
	errc <- err
}

// receive reads c to its end and returns the SHA-256 and length.
func receive(c net.Conn) ([32]byte, int, error) {
	h := sha256.New()
	n, err := io.Copy(h, c)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, int(n), err
}

func TestRelayTransfers(t *testing.T) {
	for _, shape := range relayShapes {
		for _, size := range []int{0, 1, 4<<20 + 7} {
			t.Run(shape.name+"/"+byteSize(size), func(t *testing.T) {
				r := startRelay(t, shape.wrapA, shape.wrapB)
				up, down := testnet.RandomBytes(size, 1), testnet.RandomBytes(size, 2)
				errc := make(chan error, 2)
				go send(r.client, up, errc)
				go send(r.server, down, errc)
				var wg sync.WaitGroup
				check := func(name string, c net.Conn, want []byte) {
					defer wg.Done()
					sum, n, err := receive(c)
					if err != nil || n != len(want) || sum != sha256.Sum256(want) {
						t.Errorf("%s received %d bytes (err %v), want %d; SHA-256 match %v", name, n, err, len(want), sum == sha256.Sum256(want))
					}
				}
				wg.Add(2)
				go check("server", r.server, up)
				go check("client", r.client, down)
				wg.Wait()
				for range 2 {
					if err := <-errc; err != nil {
						t.Errorf("send: %v", err)
					}
				}
				res := r.wait(t)
				if res.err != nil || res.aToB != int64(size) || res.bToA != int64(size) {
					t.Errorf("Relay = %d, %d, %v; want %d, %d, nil", res.aToB, res.bToA, res.err, size, size)
				}
				assertClosed(t, r.a, r.b)
			})
		}
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return "MiB"
	case n > 0:
		return "1B"
	}
	return "0B"
}

// assertClosed checks that Relay closed the connections it was given.
func assertClosed(t *testing.T, conns ...net.Conn) {
	t.Helper()
	for _, c := range conns {
		if _, err := c.Write([]byte{1}); !errors.Is(err, net.ErrClosed) {
			t.Errorf("write to %T after Relay: %v, want net.ErrClosed", c, err)
		}
	}
}

// TestRelayHalfClose ends one direction first and checks that the other
// keeps flowing after the first end reached the far side.
func TestRelayHalfClose(t *testing.T) {
	for _, shape := range relayShapes {
		for _, clientFirst := range []bool{true, false} {
			name := shape.name + "/server-first"
			if clientFirst {
				name = shape.name + "/client-first"
			}
			t.Run(name, func(t *testing.T) {
				r := startRelay(t, shape.wrapA, shape.wrapB)
				first, second := r.server, r.client
				if clientFirst {
					first, second = r.client, r.server
				}
				// first sends and half-closes; second sees all of it and
				// the end, then answers over the still-open direction.
				q, reply := testnet.RandomBytes(100<<10, 1), testnet.RandomBytes(300<<10, 2)
				errc := make(chan error, 2)
				go send(first, q, errc)
				sum, n, err := receive(second)
				if err != nil || n != len(q) || sum != sha256.Sum256(q) {
					t.Fatalf("first direction: %d bytes, %v", n, err)
				}
				go send(second, reply, errc)
				sum, n, err = receive(first)
				if err != nil || n != len(reply) || sum != sha256.Sum256(reply) {
					t.Fatalf("second direction after half-close: %d bytes, %v", n, err)
				}
				res := r.wait(t)
				if res.err != nil {
					t.Errorf("Relay error %v", res.err)
				}
				for range 2 {
					if err := <-errc; err != nil {
						t.Errorf("send: %v", err)
					}
				}
			})
		}
	}
}

// TestRelayWithoutCloseWrite: a destination that cannot half-close is
// closed at the end of its source, so its peer still sees the end.
func TestRelayWithoutCloseWrite(t *testing.T) {
	r := startRelay(t, asIs, asBare)
	data := testnet.RandomBytes(1<<20, 1)
	errc := make(chan error, 1)
	go send(r.client, data, errc)
	sum, n, err := receive(r.server)
	if err != nil || n != len(data) || sum != sha256.Sum256(data) {
		t.Fatalf("server received %d bytes, %v", n, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	res := r.wait(t)
	if res.err != nil || res.aToB != int64(len(data)) {
		t.Errorf("Relay = %d, %d, %v; want %d bytes and no error (the closing was Relay's own)", res.aToB, res.bToA, res.err, len(data))
	}
}

// TestRelayReset: a peer that resets mid-transfer or while idle makes
// Relay fail with the reset and close both sides, and the peer on the
// other side reads the reset too (ECONNRESET, never an end of stream: a
// stream cut short must not pass for a complete one), in each direction.
func TestRelayReset(t *testing.T) {
	for _, shape := range relayShapes {
		for _, serverResets := range []bool{true, false} {
			for _, busy := range []bool{true, false} {
				name := shape.name + "/client-resets"
				if serverResets {
					name = shape.name + "/server-resets"
				}
				if busy {
					name += "/mid-transfer"
				} else {
					name += "/idle"
				}
				t.Run(name, func(t *testing.T) {
					r := startRelay(t, shape.wrapA, shape.wrapB)
					resetter, peer := r.client, r.server
					if serverResets {
						resetter, peer = r.server, r.client
					}
					if busy {
						// peer writes towards resetter until the relay is
						// blocked on a full socket, then stops (its write
						// deadline, which leaves the socket's error alone,
						// so the read below is the first to see the reset).
						written := make(chan error, 1)
						go func() {
							chunk := testnet.RandomBytes(64<<10, 1)
							for {
								if _, err := peer.Write(chunk); err != nil {
									written <- err
									return
								}
							}
						}()
						if _, err := io.ReadFull(resetter, make([]byte, 256<<10)); err != nil {
							t.Fatal(err)
						}
						peer.SetWriteDeadline(time.Now())
						if err := <-written; !isTimeout(err) {
							t.Fatalf("peer's write: %v, want its deadline", err)
						}
					} else {
						// Let both directions park in their waits.
						time.Sleep(50 * time.Millisecond)
					}
					resetter.(*net.TCPConn).SetLinger(0)
					resetter.Close() // RST
					res := r.wait(t)
					if !errors.Is(res.err, syscall.ECONNRESET) && !errors.Is(res.err, syscall.EPIPE) {
						t.Errorf("Relay error %v, want a connection reset", res.err)
					}
					var oe *net.OpError
					if !errors.As(res.err, &oe) {
						t.Errorf("Relay error %T, want a *net.OpError", res.err)
					}
					assertClosed(t, r.a, r.b)
					peer.SetReadDeadline(time.Now().Add(5 * time.Second))
					if n, err := io.Copy(io.Discard, peer); !errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("peer read %d bytes then %v after the relay's teardown, want ECONNRESET", n, err)
					}
				})
			}
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestRelayNetPipe runs Relay over connections that are not sockets.
func TestRelayNetPipe(t *testing.T) {
	c, a := net.Pipe()
	b, s := net.Pipe()
	done := make(chan relayResult, 1)
	go func() {
		var r relayResult
		r.aToB, r.bToA, r.err = Relay(a, b)
		done <- r
	}()
	data := testnet.RandomBytes(1<<20, 1)
	go func() { c.Write(data); c.Close() }()
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	res := <-done
	if res.err != nil || res.aToB != int64(len(data)) {
		t.Errorf("Relay = %+v", res)
	}
	s.Close()
}

// transparent is a wrapper that declares itself bypassable.
type transparent struct{ net.Conn }

func (c transparent) UnwrapConn() net.Conn { return c.Conn }

// A listener's read-ahead prefix is relayed first, then the connection
// below, reached through transparent wrappers.
func TestRelayPrefixed(t *testing.T) {
	r := startRelay(t,
		func(c net.Conn) net.Conn { return transparent{Prefixed(c, []byte("HEAD"))} },
		func(c net.Conn) net.Conn { return transparent{c} })
	up, down := testnet.RandomBytes(1<<20, 1), testnet.RandomBytes(1<<20, 2)
	errc := make(chan error, 2)
	go send(r.client, up, errc)
	go send(r.server, down, errc)
	want := append([]byte("HEAD"), up...)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if sum, n, err := receive(r.server); err != nil || n != len(want) || sum != sha256.Sum256(want) {
			t.Errorf("server got %d bytes (err %v), want the prefix then %d bytes", n, err, len(up))
		}
	}()
	go func() {
		defer wg.Done()
		if sum, n, err := receive(r.client); err != nil || n != len(down) || sum != sha256.Sum256(down) {
			t.Errorf("client got %d bytes (err %v), want %d", n, err, len(down))
		}
	}()
	wg.Wait()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if res := r.wait(t); res.err != nil || res.aToB != int64(len(want)) {
		t.Fatalf("Relay = %d, %v; want %d", res.aToB, res.err, len(want))
	}
}

package dgram

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// chanCarrier is one end of a pair of Carriers over channels that take
// datagrams up to max bytes, and loses every lose-th it is given.
type chanCarrier struct {
	out, in chan []byte
	max     int
	lose    int
	mu      sync.Mutex
	sent    int
	wake    chan struct{} // the peer's readyCarrier's notify, if it is one
}

func (c *chanCarrier) SendDatagram(b []byte) error {
	if len(b) > c.max {
		return errors.New("too large")
	}
	c.mu.Lock()
	c.sent++
	lost := c.lose > 0 && c.sent%c.lose == 0
	c.mu.Unlock()
	if !lost {
		c.out <- append([]byte(nil), b...)
		if c.wake != nil {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	return nil
}

// readyCarrier is a chanCarrier whose datagrams Read takes itself
// (ReadyCarrier), as factories/quic's.
type readyCarrier struct {
	*chanCarrier
	notify chan struct{}
}

func (c *readyCarrier) TakeDatagram() ([]byte, bool) {
	select {
	case b := <-c.in:
		return b, true
	default:
		return nil, false
	}
}

func (c *readyCarrier) DatagramReady() <-chan struct{} { return c.notify }

func (c *chanCarrier) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	select {
	case b := <-c.in:
		return b, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *chanCarrier) MaxDatagram() int { return c.max }

// overPair returns two Conns over one TCP connection and a pair of
// carriers, ReadyCarriers if ready, and the first carrier.
func overPair(t *testing.T, max, lose int, ready bool) (*Conn, *Conn, *chanCarrier) {
	t.Helper()
	a, b := pair(t)
	ab, ba := make(chan []byte, 1024), make(chan []byte, 1024)
	ca := &chanCarrier{out: ab, in: ba, max: max, lose: lose}
	cb := &chanCarrier{out: ba, in: ab, max: max}
	var x, y *Conn
	if ready {
		ra := &readyCarrier{ca, make(chan struct{}, 1)}
		rb := &readyCarrier{cb, make(chan struct{}, 1)}
		ca.wake, cb.wake = rb.notify, ra.notify
		x, y = NewConnOver(a.stream, ra, nil, nil), NewConnOver(b.stream, rb, nil, nil)
	} else {
		x, y = NewConnOver(a.stream, ca, nil, nil), NewConnOver(b.stream, cb, nil, nil)
	}
	t.Cleanup(func() { x.Close(); y.Close() })
	return x, y, ca
}

// carriers runs test with a Carrier read by a goroutine, and with a
// ReadyCarrier that Read takes from itself.
func carriers(t *testing.T, test func(t *testing.T, ready bool)) {
	for _, ready := range []bool{false, true} {
		t.Run(map[bool]string{false: "pumped", true: "ready"}[ready], func(t *testing.T) { test(t, ready) })
	}
}

// Datagrams that fit the carrier ride it, and may be lost there, alone;
// larger ones ride the stream, whole; the far side's socket errors come
// on the stream, once each; a Read returns one datagram.
func TestOverCarrier(t *testing.T) { carriers(t, testOverCarrier) }

func testOverCarrier(t *testing.T, ready bool) {
	a, b, ca := overPair(t, 100, 3, ready)
	sizes := []int{0, 10, 100, 101, 5000, 60000, 50, 99}
	for i, n := range sizes {
		if _, err := a.Write(bytes.Repeat([]byte{byte(i)}, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.WriteError(syscall.ECONNREFUSED); err != nil {
		t.Fatal(err)
	}
	if ca.sent != 5 {
		t.Errorf("%d datagrams went on the carrier, want the 5 of at most 100 bytes", ca.sent)
	}
	got := map[int]bool{}
	buf := make([]byte, MaxDatagram)
	for {
		a.SetReadDeadline(time.Now().Add(time.Second))
		b.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := b.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		i := -1
		for j, s := range sizes {
			if s == n && (n == 0 || buf[0] == byte(j)) && !got[j] {
				i = j
				break
			}
		}
		if i < 0 || !bytes.Equal(buf[:n], bytes.Repeat([]byte{byte(i)}, n)) {
			t.Fatalf("read %d bytes that are no datagram sent", n)
		}
		got[i] = true
	}
	// The carrier lost its 3rd datagram (100 bytes); all else arrived.
	for i := range sizes {
		if got[i] == (i == 2) {
			t.Errorf("datagram %d (%d bytes): arrived %v", i, sizes[i], got[i])
		}
	}
	if _, err := a.Read(buf); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("read after the far side's error: %v, want ECONNREFUSED", err)
	}
	// The stream's end is io.EOF, for good, and Close stops the pumps.
	b.Close()
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range 2 {
		if _, err := a.Read(buf); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after the far side closed: %v, want its end", err)
		}
	}
}

// Close stops a Read in progress and the goroutines that read.
func TestOverClose(t *testing.T) { carriers(t, testOverClose) }

func testOverClose(t *testing.T, ready bool) {
	a, _, _ := overPair(t, 100, 0, ready)
	done := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 10))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read across Close: %v, want net.ErrClosed", err)
	}
	if err := a.SetReadDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetReadDeadline after Close: %v", err)
	}
}

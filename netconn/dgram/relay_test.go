package dgram

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// through returns the client end of a relay from a stream to a UDP
// socket connected to target, and the relay's result.
func through(t *testing.T, target net.Addr, idle time.Duration) (*Conn, chan error) {
	t.Helper()
	client, server := pair(t)
	u, err := net.DialUDP("udp", nil, target.(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := Relay(server, u, idle)
		u.Close()
		server.Close()
		done <- err
	}()
	return client, done
}

// Relay counts each direction as its own: ab what went from a to b.
// Here the far side answers every datagram with 3 bytes.
func TestRelayCounts(t *testing.T) {
	far, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer far.Close()
	go func() {
		buf := make([]byte, MaxDatagram)
		for {
			_, from, err := far.ReadFromUDP(buf)
			if err != nil {
				return
			}
			far.WriteToUDP([]byte("ack"), from)
		}
	}()
	client, server := pair(t)
	u, err := net.DialUDP("udp", nil, far.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	type counts struct{ ab, ba Counts }
	done := make(chan counts, 1)
	go func() {
		ab, ba, _ := Relay(server, u, 0)
		u.Close()
		server.Close()
		done <- counts{ab, ba}
	}()
	buf := make([]byte, MaxDatagram)
	for range 2 {
		if _, err := client.Write(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := client.Read(buf); err != nil || n != 3 {
			t.Fatalf("answer: %d bytes, %v; want 3", n, err)
		}
	}
	client.Close()
	got := <-done
	if want := (Counts{Datagrams: 2, Bytes: 20}); got.ab != want {
		t.Errorf("a to b (the stream to the socket): %+v, want %+v", got.ab, want)
	}
	if want := (Counts{Datagrams: 2, Bytes: 6}); got.ba != want {
		t.Errorf("b to a (the socket to the stream): %+v, want %+v", got.ba, want)
	}
}

func TestRelayEcho(t *testing.T) {
	echo := net.UDPAddrFromAddrPort(testnet.UDPEcho(t))
	c, done := through(t, echo, 0)
	buf := make([]byte, MaxDatagram)
	for i, n := range []int{1, 100, 1472, 8192, 60000} {
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(i*31 + j)
		}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := c.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d (%d bytes): %v", i, n, err)
		}
		if sha256.Sum256(buf[:got]) != sha256.Sum256(msg) {
			t.Fatalf("datagram %d: %d bytes back, not the %d sent", i, got, n)
		}
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatalf("relay after the client closed: %v, want nil", err)
	}
}

// A datagram to a closed port comes back as ECONNREFUSED, as from the
// program's own connected socket, and the session goes on.
func TestRelayRefused(t *testing.T) {
	closed, _ := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	addr := closed.LocalAddr()
	closed.Close()
	c, _ := through(t, addr, 0)
	c.Write([]byte("anyone?"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 16))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("read: %v, want ECONNREFUSED", err)
	}
	if _, err := c.Write([]byte("again")); err != nil {
		t.Fatalf("write after the refusal: %v", err)
	}
}

func TestRelayIdle(t *testing.T) {
	echo := net.UDPAddrFromAddrPort(testnet.UDPEcho(t))
	c, done := through(t, echo, 100*time.Millisecond)
	for i := range 4 { // traffic keeps it alive past the timeout
		c.Write([]byte(fmt.Sprint(i)))
		c.Read(make([]byte, 8))
		time.Sleep(40 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("relay ended while busy: %v", err)
	default:
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrIdle) {
			t.Fatalf("relay: %v, want ErrIdle", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an idle relay did not end")
	}
}

// A Listener's client relayed to a stream: a burst waiting in the
// session's queue goes in batches, each datagram whole and in order.
func TestRelaySessionBatches(t *testing.T) {
	l := listen(t, ListenConfig{})
	cl := client(t, l)
	const count = 200
	for i := range count { // queued before the relay starts: one batch or a few
		cl.Write(fmt.Appendf(nil, "datagram %d %s", i, make([]byte, i*7)))
	}
	s := accept(t, l)
	near, far := pair(t)
	go Relay(s, near, 0)
	buf := make([]byte, MaxDatagram)
	for i := range count {
		far.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := far.Read(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if want := fmt.Appendf(nil, "datagram %d %s", i, make([]byte, i*7)); string(buf[:n]) != string(want) {
			t.Fatalf("datagram %d: got %d bytes starting %q", i, n, buf[:min(n, 16)])
		}
	}
	far.Write([]byte("back"))
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cl.Read(buf); err != nil || string(buf[:n]) != "back" {
		t.Fatalf("the client read %q, %v", buf[:n], err)
	}
}

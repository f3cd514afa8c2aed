package vlink_test

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/quic"
	_ "github.com/vlink-dev/vlink/factories/shm"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
)

// A keyed listener refuses a connection that sends no hello as TCP
// refuses one nobody takes: with a reset, on every transport it serves,
// never with a clean end of an empty stream.
func TestPlainRefusedIsReset(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	l, err := (&vlink.ListenConfig{Policy: vlink.Policy{Key: key}, Quic: true, Shm: true}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, l, testnet.Echo)
	for _, stack := range []string{"tcp", "quic", "shm"} {
		t.Run(stack, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(stack)}
			defer d.Close()
			c, err := d.DialContext(context.Background(), "tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			c.Write([]byte("no hello here"))
			got, err := io.ReadAll(c)
			if err == nil || errors.Is(err, syscall.ETIMEDOUT) {
				t.Fatalf("read %q and %v: want a reset", got, err)
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read %q and %v: want an error matching ECONNRESET", got, err)
			}
		})
	}
}

// A listener on port 0 that also takes QUIC gets a number free on TCP
// and UDP alike, however many UDP ports others hold (here a tenth of the
// ephemeral range, so that about one TCP pick in ten is taken on UDP).
func TestQuicAnyPortFreeOnBoth(t *testing.T) {
	t.Cleanup(quic.CloseAll)
	var held []net.PacketConn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 3000 {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Skipf("holding UDP ports: %v", err)
		}
		held = append(held, c)
	}
	for i := range 60 {
		l, err := (&vlink.ListenConfig{Quic: true}).Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listener %d: %v", i, err)
		}
		l.Close()
	}
}

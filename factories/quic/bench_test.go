package quic

import (
	"context"
	"io"
	"net"
	"testing"
)

// BenchmarkTransfer sends 64 KiB writes one way over one connection on
// loopback: tcp, the baseline, and a QUIC stream. Run with -count N: the
// sub-benchmarks alternate, so each round's pair shares the machine's
// state. It measures what user-space UDP and TLS cost per byte here,
// where no path loses anything: the WAN lab (integration/bench/quic_wan.sh)
// measures what QUIC is for.
func BenchmarkTransfer(b *testing.B) {
	b.Run("tcp", func(b *testing.B) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		acc := make(chan net.Conn, 1)
		go func() {
			c, _ := l.Accept()
			acc <- c
		}()
		a, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		transfer(b, a, <-acc)
	})
	b.Run("quic", func(b *testing.B) {
		f := newFactory(b, Options{})
		lis, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer lis.Close()
		a, c, err := pair(b, f, lis)
		if err != nil {
			b.Fatal(err)
		}
		transfer(b, a, c)
		CloseAll()
	})
}

func transfer(b *testing.B, a, c net.Conn) {
	defer a.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		done <- err
	}()
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	a.(interface{ CloseWrite() error }).CloseWrite()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

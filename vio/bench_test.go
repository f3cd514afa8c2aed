package vio_test

import (
	"net"
	"testing"
)

// BenchmarkPingPong measures a 1-byte round trip over loopback TCP, the
// far end echoing with plain Read and Write: "direct" reads and writes
// the near end itself, "vio" posts the write and the read and takes their
// completions from Wait. The difference is what the posted interface
// costs a round trip (two goroutines started, two completions queued).
func BenchmarkPingPong(b *testing.B) {
	echo := func(c net.Conn) {
		buf := make([]byte, 1)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}
	b.Run("direct", func(b *testing.B) {
		a, far := tcpPair(b)
		go echo(far)
		buf := make([]byte, 1)
		for b.Loop() {
			a.Write(buf)
			if _, err := a.Read(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("vio", func(b *testing.B) {
		a, far := tcpPair(b)
		go echo(far)
		s := newSet(b)
		k := add(b, s, a)
		out, in := make([]byte, 1), make([]byte, 1)
		for b.Loop() {
			k.PostWrite(out, nil)
			k.PostRead(in, 1, nil)
			for range 2 {
				if ev := wait(b, s); ev.Err != nil {
					b.Fatal(ev.Err)
				}
			}
		}
	})
}

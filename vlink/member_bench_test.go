//go:build unix

package vlink_test

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testmember"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// BenchmarkMemberDial compares what a connection to a listener costs
// with a pre-shared key (the noise stack: a keyed hello, its challenge
// and proof, NNpsk0) and between members (the hello and accept carry
// certificates, each side checks the other's signature, KK), both ends
// in this process over loopback: blocks of dials alternate between the
// two, and each reports the median wall time per connection and the
// process's CPU time per connection (both ends), from getrusage around
// its blocks.
func BenchmarkMemberDial(b *testing.B) {
	n := testmember.New(b)
	gw, alice := n.Member("gw", nodecert.KindNode), n.Member("alice", nodecert.KindNode)
	modes := []struct {
		name   string
		policy vlink.Policy
		dialer *vlink.Dialer
	}{
		{"key", vlink.Policy{Key: key}, &vlink.Dialer{Stack: vlink.MustParse("noise"), Key: key}},
		{"member", vlink.Policy{Member: gw}, &vlink.Dialer{Stack: vlink.MustParse("noise"), Member: alice}},
	}
	addrs := make([]string, len(modes))
	for i, m := range modes {
		l, err := (&vlink.ListenConfig{Policy: m.policy}).Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		testnet.Serve(b, l, func(c net.Conn) { io.Copy(io.Discard, c) })
		addrs[i] = l.Addr().String()
	}
	const block = 20
	walls := make([][]time.Duration, len(modes))
	cpu := make([]time.Duration, len(modes))
	dials := make([]int, len(modes))
	rounds := 0
	for b.Loop() {
		rounds++
		for k := range modes {
			i := (k + rounds) % len(modes) // alternate who goes first
			before := testnet.ProcessCPU()
			for range block {
				start := time.Now()
				c, err := modes[i].dialer.Dial("tcp", addrs[i])
				if err != nil {
					b.Fatal(err)
				}
				walls[i] = append(walls[i], time.Since(start))
				c.Close()
			}
			cpu[i] += testnet.ProcessCPU() - before
			dials[i] += block
		}
	}
	for i, m := range modes {
		slices.Sort(walls[i])
		b.ReportMetric(float64(walls[i][len(walls[i])/2].Microseconds()), m.name+"_µs/conn")
		b.ReportMetric(float64(cpu[i].Microseconds())/float64(dials[i]), m.name+"_cpu_µs/conn")
	}
}

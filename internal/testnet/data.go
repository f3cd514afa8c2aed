package testnet

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"net"
	"testing"
)

// TCPPair returns both ends of a loopback TCP connection. The caller
// closes them.
func TCPPair(tb testing.TB) (client, server *net.TCPConn) {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   *net.TCPConn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.AcceptTCP()
		ch <- accepted{c, err}
	}()
	client, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		tb.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		client.Close()
		tb.Fatal(a.err)
	}
	return client, a.c
}

// RandomBytes returns n incompressible bytes, the same for the same seed,
// so a failure can be replayed.
func RandomBytes(n int, seed uint64) []byte {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	rand.NewChaCha8(key).Read(b)
	return b
}

// Sum is the SHA-256 of b in hex: what a user compares with sha256sum.
func Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// CheckTarget holds a benchmark's figure, measured against its baseline
// in the same run, to the target docs/BENCHMARKS.md sets: op is ">=" or
// "<=". It logs the check and fails the benchmark on a miss, so that
// "go test -bench" (never run by CI, where noise would make it flaky)
// exits non-zero when a target is missed.
func CheckTarget(tb testing.TB, name string, got float64, op string, limit float64) {
	tb.Helper()
	var ok bool
	switch op {
	case ">=":
		ok = got >= limit
	case "<=":
		ok = got <= limit
	default:
		tb.Fatalf("CheckTarget %s: unknown comparison %q", name, op)
	}
	if !ok {
		tb.Errorf("target %s: %.3f %s %v: MISSED", name, got, op, limit)
		return
	}
	tb.Logf("target %s: %.3f %s %v: met", name, got, op, limit)
}

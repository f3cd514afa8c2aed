package testnet

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestServe: a test's cleanup stops Serve's accept loop and waits for
// its handlers, so nothing it started outlives the test.
func TestServe(t *testing.T) {
	var handled atomic.Int32
	t.Run("echo", func(t *testing.T) {
		// The handler goes on after its client has seen the end: the
		// cleanup must wait for it.
		addr := Listen(t, func(c net.Conn) { Echo(c); time.Sleep(200 * time.Millisecond); handled.Add(1) })
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		RoundTrip(t, c, 1<<20)
	})
	if n := handled.Load(); n != 1 {
		t.Errorf("%d handlers had returned when the test's cleanup did, want 1", n)
	}
	goleak.VerifyNone(t)
}

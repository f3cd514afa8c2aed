package testnet

import (
	"fmt"
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

// cleanupTB records cleanups and errors, so a test can run a TB's end
// itself.
type cleanupTB struct {
	testing.TB
	cleanups []func()
	failed   bool
	errors   []string
}

func (tb *cleanupTB) Helper()                   {}
func (tb *cleanupTB) Cleanup(f func())          { tb.cleanups = append(tb.cleanups, f) }
func (tb *cleanupTB) Failed() bool              { return tb.failed || len(tb.errors) > 0 }
func (tb *cleanupTB) Errorf(f string, a ...any) { tb.errors = append(tb.errors, fmt.Sprintf(f, a...)) }

func (tb *cleanupTB) end() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

// TestServeLeftOpen: a client the test never closed does not hang the
// cleanup. After a failure its handler is woken at once; after a pass it
// is woken after the grace, and the test fails for the leak.
func TestServeLeftOpen(t *testing.T) {
	defer func(d time.Duration) { handlerGrace = d }(handlerGrace)
	handlerGrace = 300 * time.Millisecond
	for _, failed := range []bool{true, false} {
		t.Run(fmt.Sprintf("failed=%v", failed), func(t *testing.T) {
			tb := &cleanupTB{TB: t, failed: failed}
			addr := Listen(tb, Echo)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			c.Read(make([]byte, 1)) // the handler is running
			start := time.Now()
			tb.end()
			took := time.Since(start)
			if failed && (took > handlerGrace/2 || len(tb.errors) > 0) {
				t.Errorf("after a failure the cleanup took %v and said %q, want at once and nothing", took, tb.errors)
			}
			if !failed && (took < handlerGrace || len(tb.errors) != 1) {
				t.Errorf("after a pass the cleanup took %v and said %q, want the grace and one error", took, tb.errors)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("the client read %d bytes after the cleanup, want its connection closed", n)
			}
		})
	}
}

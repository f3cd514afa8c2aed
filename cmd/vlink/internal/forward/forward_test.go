package forward

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/metrics"
)

// TestRunWaitedThenRefused: a handler started with Run, on a goroutine
// of the caller's, is waited for by shutdown, and once shutdown has
// begun Run starts none.
func TestRunWaitedThenRefused(t *testing.T) {
	tr := NewTracker(nil)
	started, release := make(chan struct{}), make(chan struct{})
	ran := make(chan bool, 1)
	go func() {
		ran <- tr.Run(func() {
			close(started)
			<-release
		})
	}()
	<-started
	cut := make(chan int, 1)
	go func() { cut <- tr.shutdown(time.Hour) }()
	select {
	case <-cut:
		t.Fatal("shutdown did not wait for the handler Run started")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if !<-ran {
		t.Error("Run = false for a handler it ran")
	}
	<-cut
	if tr.Run(func() { t.Error("Run started a handler after shutdown") }) {
		t.Error("Run = true after shutdown")
	}
}

// TestLiveSampleNoMoreThanRelayed: a relay's live sample, taken after
// the dialed side's FIN was acknowledged (the kernel then counts the SYN
// and the FIN as bytes), is never above the bytes that crossed: else a
// scrape between the last sample and the relay's end would see the
// counter go back, or it would count bytes that never were.
func TestLiveSampleNoMoreThanRelayed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's byte counts are read on Linux only")
	}
	const n = 1000
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- -1
			return
		}
		k, _ := io.Copy(io.Discard, c)
		c.Write(make([]byte, n/2))
		c.Close()
		got <- k
	}()
	d, err := net.Dial("tcp", l.Addr().String()) // the target, as serve dials it
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	client, _ := net.Pipe()
	r := newLiveRelay(metrics.Labels{Forward: "127.0.0.1:7000", Stack: "zstd", Transport: "tcp"}, client, d, nil)
	d.Write(make([]byte, n))
	d.(*net.TCPConn).CloseWrite()
	if k := <-got; k != n {
		t.Fatalf("the target read %d bytes, want %d", k, n)
	}
	io.ReadAll(d)
	time.Sleep(50 * time.Millisecond) // the FINs acknowledged both ways
	r.sample()
	if r.seenUp != n || r.seenDown != n/2 {
		t.Fatalf("sampled %d up and %d down, want %d and %d", r.seenUp, r.seenDown, n, n/2)
	}
}

package compress

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestLinkSampler checks that tcp_info is read: after 1 MiB went through
// a loopback connection and was read, the peer acknowledges it all and
// nothing waits unsent; other connections have no sampler.
func TestLinkSampler(t *testing.T) {
	c, s := testnet.TCPPair(t)
	defer c.Close()
	defer s.Close()
	sample := linkSampler(c)
	if sample == nil {
		t.Fatal("no sampler for a *net.TCPConn")
	}
	before := sample()
	if !before.ok {
		t.Skip("this kernel's tcp_info has no notsent_bytes (before Linux 4.6)")
	}
	const n = 1 << 20
	go func() {
		c.Write(make([]byte, n))
		c.CloseWrite()
	}()
	if got, err := io.Copy(io.Discard, s); err != nil || got != n {
		t.Fatalf("read %d bytes, %v", got, err)
	}
	// The last acknowledgements may still be on their way (delayed ACKs).
	after := sample()
	for deadline := time.Now().Add(5 * time.Second); after.acked-before.acked < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		after = sample()
	}
	if !after.hasRwnd {
		t.Log("this kernel's tcp_info has no rwnd_limited (before Linux 4.10)")
	}
	if !after.ok || after.acked-before.acked < n || after.notsent != 0 {
		t.Errorf("samples %+v then %+v: want %d more bytes acknowledged and none unsent", before, after, n)
	}
	if linkSampler(hideType{c}) != nil {
		t.Error("a sampler for a connection that is not a *net.TCPConn")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if linkSampler(a) != nil {
		t.Error("a sampler for net.Pipe")
	}
}

package netconn_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
)

// wrapped stands for a filter: a conn over another, found with NetConn.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

func TestTCPCounts(t *testing.T) {
	c, s := testnet.TCPPair(t)
	defer c.Close()
	defer s.Close()
	const n = 1<<20 + 7
	go func() {
		c.Write(make([]byte, n))
		c.CloseWrite()
	}()
	if got, err := io.Copy(io.Discard, s); err != nil || got != n {
		t.Fatalf("read %d bytes, %v", got, err)
	}
	if got := netconn.TCPBelow(wrapped{wrapped{c}}); got != c {
		t.Fatalf("TCPBelow through two wrappers = %v, want the TCP conn", got)
	}
	if got := netconn.TCPBelow(wrapped{&net.UnixConn{}}); got != nil {
		t.Fatalf("TCPBelow of a unix conn = %v, want nil", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		sent, ok1 := netconn.ReadTCPCounts(c)
		recv, ok2 := netconn.ReadTCPCounts(s)
		if !ok1 || !ok2 {
			t.Fatal("no counts from the kernel")
		}
		// The kernel counts the FIN (and the sender's SYN) as a byte.
		if sent.Acked >= n && sent.Acked <= n+2 && recv.Received >= n && recv.Received <= n+1 && sent.Received <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sender acked %d, receiver received %d, sender received %d; want %d (+2), %d (+1), 0", sent.Acked, recv.Received, sent.Received, n, n)
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
	if _, ok := netconn.ReadTCPCounts(c); ok {
		t.Errorf("counts of a closed connection")
	}
}

// TestTCPCountsData: the application's bytes are the kernel's counts
// without the SYN and the FINs, whichever FINs crossed: with both ends
// open, after the dialer's FIN, and after both.
func TestTCPCountsData(t *testing.T) {
	c, s := testnet.TCPPair(t) // c dialed s
	defer c.Close()
	defer s.Close()
	const up, down = 70001, 30003
	c.Write(make([]byte, up))
	s.Write(make([]byte, down))
	io.ReadFull(s, make([]byte, up))
	io.ReadFull(c, make([]byte, down))
	check := func(stage string) {
		t.Helper()
		var ca, cr, sa, sr uint64
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			cc, ok1 := netconn.ReadTCPCounts(c)
			sc, ok2 := netconn.ReadTCPCounts(s)
			if !ok1 || !ok2 {
				t.Fatalf("%s: no counts from the kernel", stage)
			}
			ca, cr = cc.Data(true)
			sa, sr = sc.Data(false)
			if ca == up && cr == down && sa == down && sr == up {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the dialer's data acked %d and received %d, the other's %d and %d; want %d, %d, %d, %d (kernel: %+v, %+v)",
					stage, ca, cr, sa, sr, up, down, down, up, cc, sc)
			}
		}
	}
	check("open")
	c.CloseWrite()
	io.ReadAll(s)
	check("after the dialer's FIN")
	s.CloseWrite()
	io.ReadAll(c)
	check("after both FINs")
}

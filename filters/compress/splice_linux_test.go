package compress

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
)

// layerConn wraps c in the named layer: a codec, or "auto".
func layerConn(tb testing.TB, c net.Conn, name string) net.Conn {
	tb.Helper()
	if name == "auto" {
		a, err := NewAuto(AutoConfig{})
		if err != nil {
			tb.Fatal(err)
		}
		cc, _ := a.Client(c)
		return cc
	}
	cc, _ := mustNew(tb, name, defaultLevel(name)).Client(c)
	return cc
}

// TestSpliceHelperProcess is the relay process of TestSpliceRelay: a
// tunnel and a serve as vlink runs them (netconn.Relay between a plain
// TCP connection and the layer over TCP), alone in a process so that its
// I/O accounting counts their copies only.
func TestSpliceHelperProcess(t *testing.T) {
	name := os.Getenv("VLINK_SPLICE_HELPER")
	if name == "" {
		t.Skip("skipping: helper process of TestSpliceRelay")
	}
	in, mid := listenTCP(t), listenTCP(t)
	fmt.Printf("addr %s\n", in.Addr())
	a, err := in.Accept()
	if err != nil {
		t.Fatal(err)
	}
	out, err := net.Dial("tcp", mid.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := mid.Accept()
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.Dial("tcp", os.Getenv("VLINK_SPLICE_BACKEND"))
	if err != nil {
		t.Fatal(err)
	}
	r0, w0 := testnet.ProcIO(t)
	var wg sync.WaitGroup
	var up, down int64
	var terr, serr error
	wg.Go(func() { up, _, terr = netconn.Relay(a, layerConn(t, out, name)) })
	wg.Go(func() { _, down, serr = netconn.Relay(layerConn(t, b, name), back) })
	wg.Wait()
	r1, w1 := testnet.ProcIO(t)
	fmt.Printf("result %d %d %d %d %v %v\n", r1-r0, w1-w0, up, down, terr, serr)
}

func listenTCP(tb testing.TB) net.Listener {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// TestSpliceRelay: a relay through the layer, from TCP to TCP as vlink
// tunnel and serve relay, moves incompressible bytes socket to socket
// without reading them into the process, except the blocks it tries to
// compress; compressible bytes still go through the codec. Both ways,
// whole (SHA-256). Before raw payloads were spliced, each relayed byte
// passed read(2) and write(2) in both relays: 8 bytes per byte sent.
func TestSpliceRelay(t *testing.T) {
	size := int64(32 << 20)
	if raceEnabled {
		size = 8 << 20 // the race detector slows the codec tenfold
	}
	for _, tc := range []struct {
		layer, data string
	}{
		{"lz4", "random"}, {"zstd", "random"}, {"auto", "random"},
		{"lz4", "text"}, // the control: the measure does see what the codec reads
	} {
		t.Run(tc.layer+"/"+tc.data, func(t *testing.T) {
			back := listenTCP(t)
			addr, lines := testnet.StartHelper(t, "TestSpliceHelperProcess",
				"VLINK_SPLICE_HELPER="+tc.layer, "VLINK_SPLICE_BACKEND="+back.Addr().String())
			client, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatalf("dial helper at %q: %v", addr, err)
			}
			defer client.Close()
			server, err := back.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer server.Close()

			upData, downData := testnet.RandomBytes(int(size), 1), testnet.RandomBytes(int(size), 2)
			if tc.data == "text" {
				upData, downData = textCorpus(int(size)), textCorpus(int(size))
			}
			var wg sync.WaitGroup
			var upSum, downSum [32]byte
			var upErr, downErr error
			wg.Go(func() { upErr = sendAll(client, upData) })
			wg.Go(func() { downErr = sendAll(server, downData) })
			wg.Go(func() { upSum, _ = sumAll(server) })
			downSum, err = sumAll(client)
			wg.Wait()
			if err != nil || downSum != sha256.Sum256(downData) {
				t.Errorf("client received corrupt data (err %v)", err)
			}
			if upSum != sha256.Sum256(upData) {
				t.Error("server received corrupt data")
			}
			if upErr != nil || downErr != nil {
				t.Fatal(upErr, downErr)
			}

			var rchar, wchar, up, down int64
			found := false
			for lines.Scan() {
				if _, err := fmt.Sscanf(lines.Text(), "result %d %d %d %d", &rchar, &wchar, &up, &down); err == nil {
					found = true
				}
			}
			if !found {
				t.Fatal("helper reported no result")
			}
			copied := rchar + wchar
			t.Logf("relayed %d+%d bytes; the two relays read(2) %d bytes, write(2) %d: %.3f per byte sent", up, down, rchar, wchar, float64(copied)/float64(2*size))
			if up != size || down != size {
				t.Errorf("relays counted %d, %d; want %d each way", up, down, size)
			}
			if tc.data == "text" {
				// The tunnel reads each byte and the serve writes it.
				if copied < 2*2*size {
					t.Errorf("%d bytes through user space on text; want at least %d", copied, 4*size)
				}
				return
			}
			if copied > 2*size/4 {
				t.Errorf("%d bytes went through user space for %d sent; want at most a quarter (raw payloads spliced)", copied, 2*size)
			}
		})
	}
}

func sendAll(c net.Conn, data []byte) error {
	if _, err := c.Write(data); err != nil {
		return err
	}
	return c.(*net.TCPConn).CloseWrite()
}

func sumAll(c net.Conn) ([32]byte, error) {
	h := sha256.New()
	_, err := io.Copy(h, c)
	return [32]byte(h.Sum(nil)), err
}

// TestReadFromWriteDeadline: a write deadline that cuts a spliced frame
// leaves the stream whole, as for Write (TestWriteDeadlineMidFrame): the
// bytes taken from the source count as sent, what the deadline left of
// their frame goes out before anything else, and a later ReadFrom goes
// on.
func TestReadFromWriteDeadline(t *testing.T) {
	const size = 8 << 20
	data := testnet.RandomBytes(size, 3)
	srcW, srcR := testnet.TCPPair(t)
	below, peer := testnet.TCPPairBuffers(t, 64<<10, 64<<10)
	c := layerConn(t, below, "lz4").(*conn)
	go func() {
		srcW.Write(data)
		srcW.CloseWrite()
	}()
	// The peer reads nothing yet: the deadline cuts a frame.
	c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n1, err := c.ReadFrom(srcR)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadFrom with the peer not reading: %d bytes, %v; want a deadline", n1, err)
	}
	if c.tail == nil {
		t.Log("the deadline fell between frames")
	}
	c.SetWriteDeadline(time.Time{})
	got := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(layerConn(t, peer, "lz4"))
		if err != nil {
			t.Errorf("peer: %v", err)
		}
		got <- b
	}()
	n2, err := c.ReadFrom(srcR)
	if err != nil {
		t.Fatalf("ReadFrom after the deadline: %v", err)
	}
	if n1+n2 != size {
		t.Errorf("ReadFrom returned %d + %d bytes, want %d", n1, n2, size)
	}
	c.CloseWrite()
	if b := <-got; !bytes.Equal(b, data) {
		t.Errorf("peer read %d bytes, not the %d sent", len(b), size)
	}
	c.Close()
}

// TestReadFromSourceReset: a source reset in the middle of a stream
// reaches the layer's peer as a failure, never as the end of a shorter
// stream.
func TestReadFromSourceReset(t *testing.T) {
	for _, name := range []string{"lz4", "auto"} {
		t.Run(name, func(t *testing.T) {
			srcW, srcR := testnet.TCPPair(t)
			below, peer := testnet.TCPPair(t)
			relayed := make(chan error, 1)
			go func() { _, _, err := netconn.Relay(srcR, layerConn(t, below, name)); relayed <- err }()
			srcW.Write(testnet.RandomBytes(4<<20, 4))
			time.Sleep(50 * time.Millisecond)
			srcW.SetLinger(0)
			srcW.Close()
			n, err := io.Copy(io.Discard, layerConn(t, peer, name))
			if err == nil {
				t.Fatalf("the peer read %d bytes and a clean end; want a failure", n)
			}
			t.Logf("peer: %d bytes, then %v", n, err)
			if err := <-relayed; err == nil {
				t.Error("Relay reported no error for a source that reset")
			}
		})
	}
}

// TestWriteToKeepsSplicedBytes: when the destination of WriteTo fails in
// the middle of a spliced payload, the bytes it did not take are not
// lost: a later Read returns them.
func TestWriteToKeepsSplicedBytes(t *testing.T) {
	const size = 4 << 20
	data := testnet.RandomBytes(size, 5)
	below, peer := testnet.TCPPair(t)
	dst, sink := testnet.TCPPairBuffers(t, 64<<10, 64<<10)
	w := layerConn(t, peer, "lz4")
	go func() {
		w.Write(data)
		w.(*conn).CloseWrite()
	}()
	r := layerConn(t, below, "lz4").(*conn)
	dst.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := r.WriteTo(dst) // sink reads nothing yet
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WriteTo: %d bytes, %v; want a deadline", n, err)
	}
	dst.Close()
	first, err := io.ReadAll(sink)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(first)) != n {
		t.Fatalf("WriteTo said %d bytes, the destination got %d", n, len(first))
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := append(first, rest...); !bytes.Equal(got, data) {
		t.Errorf("%d bytes through WriteTo, %d read after: not the %d sent (kept %d bytes of the pipe)", len(first), len(rest), size, len(r.out))
	}
	r.Close()
}

// TestReadFromNoAllocs: splicing raw frames, both ways, allocates
// nothing once the pools are warm.
func TestReadFromNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	const size = 1 << 20
	data := testnet.RandomBytes(size, 6)
	srcW, srcR := testnet.TCPPair(t)
	below, peer := testnet.TCPPair(t)
	dst, sink := testnet.TCPPair(t)
	w := layerConn(t, below, "lz4").(*conn)
	r := layerConn(t, peer, "lz4").(*conn)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.WriteTo(dst); dst.Close() })
	wg.Go(func() { io.Copy(io.Discard, sink) })
	written := make(chan struct{})
	next := make(chan struct{})
	wg.Go(func() {
		for range next {
			srcW.Write(data)
			written <- struct{}{}
		}
	})
	defer close(next)
	lr := &io.LimitedReader{R: srcR}
	round := func() {
		next <- struct{}{}
		<-written
		lr.N = size
		if n, err := w.ReadFrom(lr); n != size || err != nil {
			t.Fatalf("ReadFrom: %d, %v", n, err)
		}
	}
	// One P: pipes go back to the pool's slot of the P that takes them
	// next (with several, a pipe left in another P's private slot makes
	// the pool make a new one, until each P has its own).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w.skip, w.backoff = 1<<30, 0 // every block raw: spliced
	for range 3 {
		round()
	}
	if allocs := testing.AllocsPerRun(10, round); allocs >= 1 {
		t.Errorf("%.1f allocations per MiB spliced", allocs)
	}
	w.CloseWrite() // r's WriteTo ends
}

// TestReadFromWaitsUnlocked: a ReadFrom waiting for its source, given a
// LimitedReader of more than has come, holds no lock: a Write beside it
// goes through at once, as beside an io.Copy waiting in Read.
func TestReadFromWaitsUnlocked(t *testing.T) {
	srcW, srcR := testnet.TCPPair(t)
	below, peer := testnet.TCPPair(t)
	c := layerConn(t, below, "lz4")
	copied := make(chan error, 1)
	go func() {
		_, err := c.(io.ReaderFrom).ReadFrom(io.LimitReader(srcR, 1<<20))
		copied <- err
	}()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(layerConn(t, peer, "lz4")); got <- b }()
	srcW.Write([]byte("first "))
	time.Sleep(100 * time.Millisecond) // ReadFrom sent it and waits for more
	wrote := make(chan error, 1)
	go func() { _, err := c.Write([]byte("second")); wrote <- err }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Write waited for a ReadFrom that waits for its source")
	}
	srcW.CloseWrite()
	if err := <-copied; err != nil {
		t.Fatalf("ReadFrom: %v", err)
	}
	c.(*conn).CloseWrite()
	if b := <-got; string(b) != "first second" {
		t.Errorf("the peer read %q", b)
	}
	c.Close()
}

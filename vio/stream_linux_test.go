package vio_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn/framed"
	"github.com/vlink-dev/vlink/vio"
)

// seqPair returns the two ends of a SOCK_SEQPACKET socket pair, as
// *net.UnixConn.
func seqPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no SOCK_SEQPACKET socket pair here: %v", err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "seqpacket")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
	}
	return cs[0], cs[1]
}

const maxMessage = 8 << 10

func streamPair(t testing.TB) (net.Conn, net.Conn) {
	a, b := seqPair(t)
	return vio.Stream(vio.NewSeqPacket(a, maxMessage)), vio.Stream(vio.NewSeqPacket(b, maxMessage))
}

func TestStreamConformance(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		a, b := streamPair(t)
		return a, b, func() { a.Close(); b.Close() }, nil
	})
}

// TestStreamTransfer: streams of 0 B to 4 MiB, both ways at once, with
// half-close, through messages of 8 KiB, checked by SHA-256.
func TestStreamTransfer(t *testing.T) {
	for _, n := range []int{0, 1, maxMessage - 1, maxMessage, 4 << 20} {
		a, b := streamPair(t)
		data := testnet.RandomBytes(n, uint64(n))
		want := sha256.Sum256(data)
		var wg sync.WaitGroup
		for _, pair := range [][2]net.Conn{{a, b}, {b, a}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				go func() {
					pair[0].Write(data)
					pair[0].(interface{ CloseWrite() error }).CloseWrite()
				}()
				h := sha256.New()
				if _, err := io.Copy(h, pair[1]); err != nil {
					t.Errorf("%d bytes: %v", n, err)
				}
				if !bytes.Equal(h.Sum(nil), want[:]) {
					t.Errorf("%d bytes: the checksum differs", n)
				}
			}()
		}
		wg.Wait()
		a.Close()
		b.Close()
	}
}

// TestStreamEnds: an abort, and a transport that ends without the end
// of the stream, are ErrReset for the reader, never io.EOF.
func TestStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(c net.Conn, raw *net.UnixConn)
		want error
	}{
		{"close", func(c net.Conn, _ *net.UnixConn) { c.Close() }, nil},
		{"abort", func(c net.Conn, _ *net.UnixConn) { c.(interface{ Abort() error }).Abort() }, vio.ErrReset},
		{"the transport dies", func(_ net.Conn, raw *net.UnixConn) { raw.Close() }, vio.ErrReset},
		{"a message of no kind", func(_ net.Conn, raw *net.UnixConn) { raw.Write([]byte("x")) }, vio.ErrMessage},
		{"a message too long", func(_ net.Conn, raw *net.UnixConn) { raw.Write(make([]byte, maxMessage+1)) }, vio.ErrMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := seqPair(t)
			sa, sb := vio.Stream(vio.NewSeqPacket(a, maxMessage)), vio.Stream(vio.NewSeqPacket(b, maxMessage))
			defer sa.Close()
			defer sb.Close()
			sa.Write([]byte("partial"))
			tc.end(sa, a)
			sb.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(sb)
			if string(got) != "partial" {
				t.Errorf("read %q, want %q", got, "partial")
			}
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("read's end: %v, want %v", err, tc.want)
			}
			// The one reset every transport and framed layer reports.
			if tc.want == vio.ErrReset && (!errors.Is(err, framed.ErrReset) || !errors.Is(err, syscall.ECONNRESET)) {
				t.Errorf("read's end: %v, want it to match framed.ErrReset and ECONNRESET", err)
			}
		})
	}
}

// TestStreamCloseDuringWrite: a Close while a Write is blocked (the peer
// does not read) cuts the stream: the Write fails with net.ErrClosed and
// the peer, reading what got through, then reads ErrReset, not io.EOF.
func TestStreamCloseDuringWrite(t *testing.T) {
	a, b := streamPair(t)
	defer b.Close()
	wrote := make(chan error, 1)
	go func() { _, err := a.Write(make([]byte, 32<<20)); wrote <- err }()
	if _, err := io.ReadFull(b, make([]byte, 1)); err != nil { // the Write runs
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits for the Write in progress")
	}
	if err := <-wrote; !errors.Is(err, net.ErrClosed) {
		t.Errorf("the Write Close cut short: %v, want net.ErrClosed", err)
	}
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(b)
	if !errors.Is(err, vio.ErrReset) {
		t.Fatalf("peer read %d more bytes, then %v; want ErrReset", len(got), err)
	}
}

// messages is a MessageConn that delivers given messages, then io.EOF.
type messages struct {
	net.Conn // unused; for the addresses
	msgs     [][]byte
}

func (m *messages) ReadMessage(p []byte) (int, error) {
	if len(m.msgs) == 0 {
		return 0, io.EOF
	}
	n := copy(p, m.msgs[0])
	m.msgs = m.msgs[1:]
	return n, nil
}
func (m *messages) WriteMessage(p []byte) error      { return nil }
func (m *messages) MaxMessage() int                  { return 64 }
func (m *messages) SetReadDeadline(time.Time) error  { return nil }
func (m *messages) SetWriteDeadline(time.Time) error { return nil }
func (m *messages) LocalAddr() net.Addr              { return &net.UnixAddr{} }
func (m *messages) RemoteAddr() net.Addr             { return &net.UnixAddr{} }
func (m *messages) Close() error                     { return nil }

// FuzzStream reads a stream out of any messages: it returns the data
// messages' bytes, in order, then io.EOF after a well-formed end, or an
// error matching ErrReset or ErrMessage; never a panic.
func FuzzStream(f *testing.F) {
	f.Add([]byte("dhello\x00fworld"), byte(5))
	f.Add([]byte("d\x00r"), byte(1))
	f.Add([]byte("dabc\x00dde\x00f"), byte(4))
	f.Fuzz(func(t *testing.T, raw []byte, _ byte) {
		var msgs [][]byte
		for _, m := range bytes.Split(raw, []byte{0}) {
			msgs = append(msgs, m[:min(len(m), 64)])
		}
		var want []byte
		clean := false
		for _, m := range msgs {
			if len(m) > 1 && m[0] == 'd' {
				want = append(want, m[1:]...)
				continue
			}
			clean = len(m) == 1 && m[0] == 'f'
			break
		}
		got, err := io.ReadAll(vio.Stream(&messages{msgs: msgs}))
		if !bytes.Equal(got, want) {
			t.Fatalf("read %q, want %q", got, want)
		}
		if clean != (err == nil) {
			t.Fatalf("end %v, clean end expected: %v", err, clean)
		}
		if err != nil && !errors.Is(err, vio.ErrReset) && !errors.Is(err, vio.ErrMessage) {
			t.Fatalf("end %v", err)
		}
	})
}

// BenchmarkStream moves 64 KiB writes through Stream over a
// SOCK_SEQPACKET pair of 8 KiB messages, against the same bytes written
// to the pair directly in 8 KiB messages: the adapter's cost, a kind
// byte and a copy into its message buffer per message.
func BenchmarkStream(b *testing.B) {
	buf := make([]byte, 64<<10)
	for _, way := range []string{"direct", "stream"} {
		b.Run(way, func(b *testing.B) {
			a, c := seqPair(b)
			var w io.Writer = a
			var r io.Reader = c
			if way == "stream" {
				sa, sc := vio.Stream(vio.NewSeqPacket(a, maxMessage)), vio.Stream(vio.NewSeqPacket(c, maxMessage))
				defer sa.Close()
				defer sc.Close()
				w, r = sa, sc
			} else {
				defer a.Close()
				defer c.Close()
				w = writerFunc(func(p []byte) (int, error) { // 8 KiB messages, as Stream sends
					for i := 0; i < len(p); i += maxMessage {
						if _, err := a.Write(p[i:min(len(p), i+maxMessage)]); err != nil {
							return i, err
						}
					}
					return len(p), nil
				})
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				rb := make([]byte, maxMessage)
				for n := 0; n < b.N*len(buf); {
					k, err := r.Read(rb)
					if err != nil {
						return
					}
					n += k
				}
			}()
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for range b.N {
				if _, err := w.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			<-done
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

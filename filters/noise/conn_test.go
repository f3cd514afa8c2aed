package noise

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	flynn "github.com/flynn/noise"
	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestNettest(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			a, b := testnet.TCPPair(t)
			c1, c2 = pair(t, a, b)
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		})
	})
	// net.Pipe: unbuffered, with its own deadlines, no half-close.
	t.Run("pipe", func(t *testing.T) {
		nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
			a, b := net.Pipe()
			c1, c2 = pair(t, a, b)
			// An unbuffered pipe takes the end record each Close lingers
			// to send only from a reader: close the pipes too.
			return c1, c2, func() { c1.Close(); c2.Close(); a.Close(); b.Close() }, nil
		})
	})
}

// TestTransfer sends data both ways at once, each side half-closing when
// done, and checks what arrives by SHA-256.
func TestTransfer(t *testing.T) {
	for _, size := range []int{0, 1, MaxPlain - 1, MaxPlain, MaxPlain + 1, 4*MaxPlain + 7, 5 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			c1, c2 := pair(t, a, b)
			defer c1.Close()
			defer c2.Close()
			c1.SetDeadline(time.Now().Add(30 * time.Second)) // a failure must not hang
			c2.SetDeadline(time.Now().Add(30 * time.Second))
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for i, p := range [][2]net.Conn{{c1, c2}, {c2, c1}} {
				data := testnet.RandomBytes(size, uint64(i+1))
				wg.Add(2)
				go func() {
					defer wg.Done()
					_, err := p[0].Write(data)
					if err == nil {
						err = p[0].(closeWriter).CloseWrite()
					}
					errs <- err
				}()
				go func() {
					defer wg.Done()
					got, err := io.ReadAll(p[1])
					if err == nil && sha256.Sum256(got) != sha256.Sum256(data) {
						err = fmt.Errorf("received %d bytes that differ from the %d sent", len(got), len(data))
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestHandshake checks who completes the handshake: only peers with the
// same key and the same transcript; the others fail on both sides, with
// ErrAuth where the failure is seen, and no application byte crosses.
func TestHandshake(t *testing.T) {
	other := []byte("another key, 16 bytes or more")
	tests := []struct {
		name                 string
		clientKey, serverKey []byte
		clientTr, serverTr   []byte
		clientIs, serverIs   error
	}{
		{"same", testKey, testKey, testTranscript, testTranscript, nil, nil},
		{"wrong key", testKey, other, testTranscript, testTranscript, errPeerGone, ErrAuth},
		{"other hello", testKey, testKey, testTranscript, []byte("changed on the way"), errPeerGone, ErrAuth},
		{"no client key", nil, testKey, testTranscript, testTranscript, layer.ErrKeyRequired, errPeerGone},
		{"short server key", testKey, []byte("short"), testTranscript, testTranscript, errPeerGone, layer.ErrKeyRequired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			defer a.Close()
			defer b.Close()
			type res struct {
				c   net.Conn
				err error
			}
			ch := make(chan res, 1)
			go func() {
				c, err := Filter{}.ServerHandshake(b, layer.Handshake{Key: tt.serverKey, Transcript: tt.serverTr})
				if err != nil {
					b.Close() // as the listener does
				}
				ch <- res{c, err}
			}()
			c, cerr := Filter{}.ClientHandshake(a, layer.Handshake{Key: tt.clientKey, Transcript: tt.clientTr})
			if cerr != nil {
				a.Close()
			}
			s := <-ch
			check := func(side string, err, want error) {
				t.Helper()
				if want == errPeerGone && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
					want = err
				}
				if want == nil && err != nil || want != nil && !errors.Is(err, want) {
					t.Errorf("%s: %v, want %v", side, err, want)
				}
				var oe *net.OpError
				if err != nil && (!errors.As(err, &oe) || oe.Net != "noise") {
					t.Errorf("%s: %v is not a *net.OpError naming noise", side, err)
				}
			}
			check("client", cerr, tt.clientIs)
			check("server", s.err, tt.serverIs)
			if cerr == nil && s.err == nil {
				go c.Write([]byte("ping"))
				buf := make([]byte, 4)
				if _, err := io.ReadFull(s.c, buf); err != nil || string(buf) != "ping" {
					t.Fatalf("read %q, %v", buf, err)
				}
				c.Close()
				s.c.Close()
			}
		})
	}
}

// errPeerGone stands for the end of the handshake a side sees when its
// peer gave up: io.ErrUnexpectedEOF, or a reset if the peer closed with
// bytes unread.
var errPeerGone = errors.New("the peer closed or reset the connection")

// TestCipherMatchesFlynn checks that cipherState seals exactly as
// flynn/noise's CipherState does, record after record, with each cipher
// (their nonces differ in byte order).
func TestCipherMatchesFlynn(t *testing.T) {
	for _, tc := range []struct {
		aead  layer.AEAD
		suite flynn.CipherSuite
	}{
		{layer.AEADChaChaPoly, suite},
		{layer.AEADAESGCM, suiteAES},
	} {
		t.Run(tc.aead.String(), func(t *testing.T) {
			k := [32]byte{9, 8, 7}
			ref := flynn.UnsafeNewCipherState(tc.suite, k, 0)
			ours, _ := newCipherState(flynn.UnsafeNewCipherState(tc.suite, k, 0), tc.aead)
			for i, p := range [][]byte{nil, []byte("a"), testnet.RandomBytes(MaxPlain, 3), []byte("last")} {
				ad := []byte{byte(i), 1, 2}
				want, _ := ref.Encrypt(nil, ad, p)
				got, _ := ours.seal(nil, ad, p)
				if !bytes.Equal(got, want) {
					t.Fatalf("record %d: sealed bytes differ from flynn/noise's", i)
				}
			}
		})
	}
}

// TestReadDeadlineMidRecord checks that deadlines firing anywhere in a
// record lose nothing.
func TestReadDeadlineMidRecord(t *testing.T) {
	data := testnet.RandomBytes(3*MaxPlain+100, 7)
	writes := [][]byte{data[:5], data[5 : 2*MaxPlain], data[2*MaxPlain:]}
	for _, step := range []int{1, 3, 4096, 100000} {
		for _, bufSize := range []int{7, 64 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("step%d/buf%d", step, bufSize), func(t *testing.T) {
				wire, recv := encode(t, true, writes...)
				c := newConn(&testnet.DribbleConn{Data: wire, Step: step}, nil, recv)
				var got []byte
				buf := make([]byte, bufSize)
				timeouts := 0
				for {
					n, err := c.Read(buf)
					got = append(got, buf[:n]...)
					if err == io.EOF {
						break
					}
					if err != nil {
						if !errors.Is(err, os.ErrDeadlineExceeded) {
							t.Fatalf("Read: %v", err)
						}
						timeouts++
					}
				}
				if timeouts == 0 {
					t.Fatal("no deadline fired")
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("got %d bytes, want %d", len(got), len(data))
				}
			})
		}
	}
}

// TestWriteDeadlineMidRecord cuts writes at every kind of position and
// checks the stream stays whole: records partly sent count as written,
// and their rest goes out before anything else.
func TestWriteDeadlineMidRecord(t *testing.T) {
	data := testnet.RandomBytes(6*MaxPlain+100, 7)
	writes := [][]byte{data[:10], data[10 : 5*MaxPlain], data[5*MaxPlain:]}
	full, _ := encode(t, true, writes...)
	for _, cutAt := range []int{0, 1, headerSize, headerSize + 5, 40, 1000, len(full) / 2, len(full) - 20, len(full) - 1} {
		t.Run(fmt.Sprintf("cut%d", cutAt), func(t *testing.T) {
			send, recv := states()
			cc := &testnet.CutConn{CutAt: cutAt}
			c := newConn(cc, send, nil)
			var sent []byte
			for _, w := range writes {
				for len(w) > 0 {
					n, err := c.Write(w)
					sent = append(sent, w[:n]...)
					w = w[n:]
					if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("Write: %v", err)
					}
				}
			}
			err := c.CloseWrite()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = c.CloseWrite() // the cut fell in the end record
			}
			if err != nil {
				t.Fatalf("CloseWrite: %v", err)
			}
			got, err := io.ReadAll(newConn(&testnet.FakeConn{R: &cc.Wire}, nil, recv))
			if err != nil {
				t.Fatalf("reading back: %v", err)
			}
			if !bytes.Equal(got, sent) || !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, sent %d of %d", len(got), len(sent), len(data))
			}
		})
	}
}

func TestPastDeadlineSendsNothing(t *testing.T) {
	a, b := testnet.TCPPair(t)
	c, s := pair(t, a, b)
	defer c.Close()
	defer s.Close()
	c.SetWriteDeadline(time.Unix(1, 0))
	n, err := c.Write(testnet.RandomBytes(1<<20, 1))
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write = %d, %v; want 0 and a deadline error", n, err)
	}
	c.SetWriteDeadline(time.Time{})
	if _, err := c.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	c.(closeWriter).CloseWrite()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "after" {
		t.Fatalf("peer read %q, %v; want \"after\"", got, err)
	}
}

// TestEnds checks how a stream ends: Close and CloseWrite send the end
// record (a clean io.EOF at the peer), Abort and a connection cut below
// do not (io.ErrUnexpectedEOF, naming noise).
func TestEnds(t *testing.T) {
	tests := []struct {
		name  string
		end   func(c net.Conn, raw *net.TCPConn) error
		clean bool
	}{
		{"close", func(c net.Conn, _ *net.TCPConn) error { return c.Close() }, true},
		{"closewrite", func(c net.Conn, _ *net.TCPConn) error { return c.(closeWriter).CloseWrite() }, true},
		{"abort", func(c net.Conn, _ *net.TCPConn) error { return c.(netconn.Aborter).Abort() }, false},
		{"netconn.Abort", func(c net.Conn, _ *net.TCPConn) error { return netconn.Abort(c) }, false},
		{"cut below", func(c net.Conn, raw *net.TCPConn) error { return raw.Close() }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			c, s := pair(t, a, b)
			defer c.Close()
			defer s.Close()
			if _, err := c.Write([]byte("some bytes")); err != nil {
				t.Fatal(err)
			}
			if err := tt.end(c, a); err != nil {
				t.Fatal(err)
			}
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(s)
			if string(got) != "some bytes" {
				t.Fatalf("peer read %q", got)
			}
			if tt.clean {
				if err != nil {
					t.Fatalf("peer: %v, want a clean end", err)
				}
				return
			}
			var oe *net.OpError
			if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
				t.Fatalf("peer: %v, want io.ErrUnexpectedEOF or a reset", err)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) && (!errors.As(err, &oe) || oe.Net != "noise") {
				t.Fatalf("peer: %v is not a *net.OpError naming noise", err)
			}
		})
	}
}

func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }

// TestTruncated cuts a stream at every record boundary and inside
// records: the reader returns only whole authenticated records and then
// io.ErrUnexpectedEOF, never a clean end.
func TestTruncated(t *testing.T) {
	data := testnet.RandomBytes(3*MaxPlain, 5)
	wire, _ := encode(t, true, data)
	for _, cut := range []int{0, 1, headerSize, headerSize + maxRecord, headerSize + maxRecord + 1, len(wire) - headerSize - tagSize, len(wire) - 1} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			_, recv := states()
			got, err := io.ReadAll(newConn(&testnet.FakeConn{R: bytes.NewReader(wire[:cut])}, nil, recv))
			var oe *net.OpError
			if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &oe) || oe.Net != "noise" {
				t.Fatalf("read %d bytes then %v; want io.ErrUnexpectedEOF in a *net.OpError naming noise", len(got), err)
			}
			if !bytes.HasPrefix(data, got) {
				t.Fatal("read bytes that were not sent")
			}
		})
	}
}

// TestTamper flips bits all over a stream, and replays, reorders and
// drops records: the reader fails with ErrAuth, for good, and never
// returns a byte that was not sent at that place.
func TestTamper(t *testing.T) {
	data := testnet.RandomBytes(2*MaxPlain+300, 9)
	wire, _ := encode(t, true, data[:300], data[300:])
	recs := records(wire) // 300 bytes, two full records, the end
	if len(recs) != 4 {
		t.Fatalf("%d records", len(recs))
	}
	join := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	tests := map[string][]byte{
		"replay first":   join(recs[0], recs[0], recs[1], recs[2], recs[3]),
		"swap":           join(recs[0], recs[2], recs[1], recs[3]),
		"drop":           join(recs[0], recs[2], recs[3]),
		"end early":      join(recs[0], recs[3]),
		"record as end":  join(recs[0], append([]byte{byte(recEnd)}, recs[1][1:]...)),
		"end as data":    join(recs[0], recs[1], recs[2], append([]byte{byte(recData)}, recs[3][1:]...)),
		"handshake type": join(append([]byte{byte(recHandshake)}, recs[0][1:]...)),
	}
	for _, pos := range []int{0, 1, 2, headerSize, headerSize + 100, len(recs[0]) - 1, len(recs[0]) + 50000, len(wire) - 1} {
		for _, bit := range []byte{0x01, 0x80} {
			b := bytes.Clone(wire)
			b[pos] ^= bit
			tests[fmt.Sprintf("flip %d^%#x", pos, bit)] = b
		}
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			_, recv := states()
			c := newConn(&testnet.FakeConn{R: bytes.NewReader(in)}, nil, recv)
			got, err := io.ReadAll(c)
			if !errors.Is(err, ErrAuth) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("read %d bytes then %v; want ErrAuth", len(got), err)
			}
			if !bytes.HasPrefix(data, got) {
				t.Fatal("read bytes that were not sent there")
			}
			if _, again := c.Read(make([]byte, 10)); again == nil || again.Error() != err.Error() {
				t.Fatalf("read after the failure: %v, want the same failure", again)
			}
		})
	}
}

// TestNoAllocs checks that writing and reading records allocates nothing
// once the pools are warm.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	data := testnet.RandomBytes(5*MaxPlain, 7)
	wire, recv := encode(t, true, data, data[:100])
	send, _ := states()
	w := newConn(&testnet.FakeConn{W: io.Discard}, send, nil)
	src := bytes.NewReader(wire)
	eof := testnet.NewEOFSignal(src)
	r := newConn(&testnet.FakeConn{R: eof}, nil, recv)
	small, big := make([]byte, 32<<10), make([]byte, 256<<10)
	// The end record starts the tail reader (framed.Ends.PeerEnded), which
	// reads src to its end: the rounds read src again once it is done.
	for {
		if _, err := r.Read(big); err != nil {
			break
		}
	}
	eof.Wait(t)
	allocs := testing.AllocsPerRun(20, func() {
		w.Write(data)
		w.Write(data[:100])
		for _, buf := range [][]byte{small, big} {
			src.Reset(wire)
			recv.n = 0 // read the same records again
			r.rerr = nil
			for {
				if _, err := r.Read(buf); err != nil {
					break
				}
			}
			if r.rerr != io.EOF {
				t.Fatalf("reading back: %v", r.rerr)
			}
		}
	})
	if allocs >= 1 {
		t.Errorf("%.1f allocations per round", allocs)
	}
}

func TestRegistered(t *testing.T) {
	spec, ok := layer.Lookup("noise")
	if !ok || spec.Kind != layer.KindFilter {
		t.Fatalf("noise is not registered as a filter: %+v", spec)
	}
	v, err := spec.Build(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := v.(layer.HandshakeFilter); !ok {
		t.Fatalf("%T is not a layer.HandshakeFilter", v)
	}
	if _, err := v.(layer.Filter).Client(nil); !errors.Is(err, layer.ErrKeyRequired) {
		t.Fatalf("Client without a handshake: %v, want ErrKeyRequired", err)
	}
}

// TestIdleHoldsNoBuffer checks that a connection waiting for its next
// record, or done writing, holds no pooled buffer.
func TestIdleHoldsNoBuffer(t *testing.T) {
	a, b := testnet.TCPPair(t)
	c, s := pair(t, a, b)
	defer c.Close()
	defer s.Close()
	for _, size := range []int{1, MaxPlain + 10} {
		if _, err := c.Write(testnet.RandomBytes(size, 1)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		sc, cc := s.(*conn), c.(*conn)
		sc.ends.LockRead()
		held := sc.rbuf != nil || sc.plain != nil
		sc.ends.UnlockRead()
		cc.ends.LockWrite()
		held = held || cc.tail != nil
		cc.ends.UnlockWrite()
		if held {
			t.Fatalf("after %d bytes, an idle connection holds a buffer", size)
		}
	}
}

// TestCloseAfterPeerEnd: a side that read the peer's end record, answered
// and closed must first read the end of the layer below (compression's
// end frame, in noise+zstd), which the peer's CloseWrite sends right
// after the end record. Closing the socket with it unread makes the
// kernel reset the connection and throw away the end of the answer
// still on its way.
func TestCloseAfterPeerEnd(t *testing.T) {
	for _, closeWrite := range []bool{false, true} {
		name := "close"
		if closeWrite {
			name = "closewrite"
		}
		t.Run(name, func(t *testing.T) {
			// Small buffers: the answer is still on its way when the
			// server closes.
			a, b := testnet.TCPPairBuffers(t, 16<<10, 64<<10)
			defer a.Close()
			defer b.Close()
			client, server := pair(t, testnet.TrailerConn{TCPConn: a}, b)
			defer client.Close()
			if _, err := client.Write([]byte("question")); err != nil {
				t.Fatal(err)
			}
			shut := make(chan error, 1)
			go func() { shut <- client.(closeWriter).CloseWrite() }()
			if q, err := io.ReadAll(server); err != nil || string(q) != "question" {
				t.Fatalf("server read %q, %v", q, err)
			}
			if err := <-shut; err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the trailer is in the server's socket, unread
			answer := testnet.RandomBytes(4<<20, 7)
			done := make(chan error, 1)
			go func() {
				_, err := server.Write(answer)
				if closeWrite && err == nil {
					err = server.(closeWriter).CloseWrite()
				}
				if cerr := server.Close(); err == nil {
					err = cerr
				}
				done <- err
			}()
			// The client reads all but the answer's last 100 KiB, which the
			// buffers hold, and waits: the server's Write returns and it
			// closes with them still on their way.
			client.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len(answer)-100<<10)
			if _, err := io.ReadFull(client, got); err != nil {
				t.Fatalf("client read: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
			rest, err := io.ReadAll(client)
			got = append(got, rest...)
			if err != nil || !bytes.Equal(got, answer) {
				t.Errorf("client read %d of %d bytes of the answer: %v", len(got), len(answer), err)
			}
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
}

// TestCloseAfterFailedRead: a connection whose read side failed (a
// record that did not authenticate) is aborted by Close, as a socket
// closed with bytes unread is reset: the peer, whose stream did not
// arrive whole, reads an error, never a clean end.
func TestCloseAfterFailedRead(t *testing.T) {
	a, b := testnet.TCPPair(t)
	defer a.Close()
	defer b.Close()
	client, server := pair(t, a, b)
	defer client.Close()
	// A record the client's noise never sealed, written below it.
	forged := make([]byte, headerSize+40)
	(*header)(forged).set(recData, 40)
	if _, err := a.Write(forged); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Read(make([]byte, 100)); !errors.Is(err, ErrAuth) {
		t.Fatalf("server read: %v, want ErrAuth", err)
	}
	server.Close()
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(client)
	if err == nil {
		t.Fatalf("the client read %q and a clean end from a peer whose read failed", got)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("client read: %v, want the peer's abort", err)
	}
}

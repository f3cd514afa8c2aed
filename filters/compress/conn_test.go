package compress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

// hideType hides the concrete type of a connection, so the writer cannot
// use writev and copies raw frames instead; it keeps CloseWrite.
type hideType struct{ *net.TCPConn }

func TestNettest(t *testing.T) {
	type pipe struct {
		name string
		wrap func(*net.TCPConn) net.Conn
	}
	pipes := []pipe{
		{"tcp", func(c *net.TCPConn) net.Conn { return c }},
		{"tcp-copy", func(c *net.TCPConn) net.Conn { return hideType{c} }},
	}
	for _, name := range codecNames {
		for _, level := range []int{defaultLevel(name), 1} {
			f := mustNew(t, name, level)
			for _, p := range pipes {
				t.Run(fmt.Sprintf("%s-%d/%s", name, level, p.name), func(t *testing.T) {
					nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
						a, b := testnet.TCPPair(t)
						c1, _ = f.Client(p.wrap(a))
						c2, _ = f.Server(p.wrap(b))
						return c1, c2, func() { c1.Close(); c2.Close() }, nil
					})
				})
			}
			// net.Pipe: unbuffered, with its own deadlines, no half-close.
			t.Run(fmt.Sprintf("%s-%d/pipe", name, level), func(t *testing.T) {
				nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
					a, b := net.Pipe()
					c1, _ = f.Client(a)
					c2, _ = f.Server(b)
					// Both ends close at once, and an unbuffered pipe takes the end
					// frame each Close lingers to send only from a reader: close the
					// pipes too, so neither linger waits for its 10 s.
					return c1, c2, func() { c1.Close(); c2.Close(); a.Close(); b.Close() }, nil
				})
			})
		}
	}
}

// TestTransfer sends data both ways at once, each side half-closing when
// done, and checks what arrives by SHA-256.
func TestTransfer(t *testing.T) {
	sizes := []int{0, 1, 100, 64<<10 - 1, 64 << 10, 64<<10 + 1, MaxBlock - 1, MaxBlock, MaxBlock + 1, 3<<20 + 17}
	if testing.Short() || raceEnabled {
		sizes[len(sizes)-1] = 1<<20 + 17
	}
	data := map[string][]byte{"text": textCorpus(4 << 20), "random": testnet.RandomBytes(4<<20, 7)}
	readers := map[string]func(io.Reader) ([]byte, error){
		"WriteTo": func(r io.Reader) ([]byte, error) {
			var b bytes.Buffer
			_, err := r.(io.WriterTo).WriteTo(&b)
			return b.Bytes(), err
		},
		"Read1000": func(r io.Reader) ([]byte, error) {
			var b bytes.Buffer
			_, err := io.CopyBuffer(&b, struct{ io.Reader }{r}, make([]byte, 1000))
			return b.Bytes(), err
		},
	}
	for _, name := range codecNames {
		f := mustNew(t, name, defaultLevel(name))
		for kind, src := range data {
			for rname, read := range readers {
				for _, size := range sizes {
					t.Run(fmt.Sprintf("%s/%s/%s/%d", name, kind, rname, size), func(t *testing.T) {
						a, b := testnet.TCPPair(t)
						c, _ := f.Client(a)
						s, _ := f.Server(b)
						defer c.Close()
						defer s.Close()
						exchange(t, c, s, src[:size], src[len(src)-size:], read)
					})
				}
			}
		}
	}
}

// TestTransferNoHalfClose runs the exchange over net.Pipe, which cannot
// half-close: the end frame alone must give each reader its EOF.
func TestTransferNoHalfClose(t *testing.T) {
	src := textCorpus(1 << 20)
	read := func(r io.Reader) ([]byte, error) { return io.ReadAll(r) }
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			f := mustNew(t, name, defaultLevel(name))
			a, b := net.Pipe()
			c, _ := f.Client(a)
			s, _ := f.Server(b)
			defer c.Close()
			defer s.Close()
			exchange(t, c, s, src[:700<<10], testnet.RandomBytes(300<<10, 7), read)
		})
	}
}

// exchange writes up from c to s and down from s to c concurrently, in
// writes of varied sizes, each writer half-closing at the end.
func exchange(t *testing.T, c, s net.Conn, up, down []byte, read func(io.Reader) ([]byte, error)) {
	t.Helper()
	var wg sync.WaitGroup
	send := func(w net.Conn, data []byte) {
		defer wg.Done()
		for i, step := 0, 1; len(data) > 0; i++ {
			n := min(len(data), step)
			if _, err := w.Write(data[:n]); err != nil {
				t.Errorf("Write: %v", err)
				return
			}
			data = data[n:]
			step = step*3 + i // 1, 3, 10, 32, ... then large
			if step > 3*MaxBlock {
				step = 1
			}
		}
		if err := w.(closeWriter).CloseWrite(); err != nil {
			t.Errorf("CloseWrite: %v", err)
		}
	}
	recv := func(r net.Conn, got *[]byte) {
		defer wg.Done()
		b, err := read(r)
		if err != nil {
			t.Errorf("read: %v", err)
		}
		*got = b
	}
	var gotUp, gotDown []byte
	wg.Add(4)
	go send(c, up)
	go send(s, down)
	go recv(s, &gotUp)
	go recv(c, &gotDown)
	wg.Wait()
	if len(gotUp) != len(up) || testnet.Sum(gotUp) != testnet.Sum(up) {
		t.Errorf("client to server: got %d bytes (sha256 %x), want %d (%x)", len(gotUp), testnet.Sum(gotUp), len(up), testnet.Sum(up))
	}
	if len(gotDown) != len(down) || testnet.Sum(gotDown) != testnet.Sum(down) {
		t.Errorf("server to client: got %d bytes (sha256 %x), want %d (%x)", len(gotDown), testnet.Sum(gotDown), len(down), testnet.Sum(down))
	}
}

// TestReadDeadlineMidFrame checks that deadlines firing anywhere in a
// frame lose nothing: every timed-out Read is retried and the stream
// still arrives whole.
func TestReadDeadlineMidFrame(t *testing.T) {
	text, random := textCorpus(300<<10), testnet.RandomBytes(200<<10, 7)
	for _, name := range codecNames {
		wire := ended(encode(t, name, defaultLevel(name), text[:5], text, random, text[:1000]))
		want := append(append(append(append([]byte{}, text[:5]...), text...), random...), text[:1000]...)
		for _, step := range []int{1, 3, 4096} {
			for _, bufSize := range []int{7, 64 << 10, 1 << 20} {
				t.Run(fmt.Sprintf("%s/step%d/buf%d", name, step, bufSize), func(t *testing.T) {
					c := newConn(&testnet.DribbleConn{Data: wire, Step: step}, name, mustNew(t, name, 1).codec)
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
					if !bytes.Equal(got, want) {
						t.Fatalf("got %d bytes, want %d", len(got), len(want))
					}
				})
			}
		}
	}
}

// TestWriteDeadlineMidFrame cuts writes at every kind of position and
// checks the stream stays whole: a block whose frame was partly sent
// counts as written, and its rest goes out before the next frame.
func TestWriteDeadlineMidFrame(t *testing.T) {
	text, random := textCorpus(MaxBlock*2+100), testnet.RandomBytes(MaxBlock+50, 7)
	writes := [][]byte{text, random, text[:10]}
	for _, name := range codecNames {
		full := encode(t, name, defaultLevel(name), writes...)
		for _, cutAt := range []int{0, 3, headerSize, headerSize + 5, 1000, len(full) / 2, len(full) - 20, len(full) - 1} {
			for _, wrap := range []string{"copy", "vectored"} {
				t.Run(fmt.Sprintf("%s/%s/cut%d", name, wrap, cutAt), func(t *testing.T) {
					cc := &testnet.CutConn{CutAt: cutAt}
					c := newConn(cc, name, mustNew(t, name, defaultLevel(name)).codec)
					c.vectored = wrap == "vectored" // testnet.FakeConn has no writev, but send must cope the same
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
					if err := c.CloseWrite(); err != nil {
						t.Fatalf("CloseWrite: %v", err)
					}
					r := newConn(&testnet.FakeConn{R: &cc.Wire}, name, c.codec)
					got, err := io.ReadAll(r)
					if err != nil {
						t.Fatalf("reading back: %v", err)
					}
					if !bytes.Equal(got, sent) {
						t.Fatalf("read back %d bytes, sent %d", len(got), len(sent))
					}
				})
			}
		}
	}
}

func TestPastDeadlineSendsNothing(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			f := mustNew(t, name, defaultLevel(name))
			c, _ := f.Client(a)
			s, _ := f.Server(b)
			defer c.Close()
			defer s.Close()
			c.SetWriteDeadline(time.Unix(1, 0))
			n, err := c.Write(textCorpus(1 << 20))
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
		})
	}
}

func TestClose(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			f := mustNew(t, name, defaultLevel(name))
			c, _ := f.Client(a)
			s, _ := f.Server(b)
			defer s.Close()

			// Close unblocks a pending Read and WriteTo.
			errs := make(chan error, 2)
			go func() { _, err := c.Read(make([]byte, 10)); errs <- err }()
			time.Sleep(20 * time.Millisecond)
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := <-errs; !errors.Is(err, net.ErrClosed) {
				t.Errorf("pending Read: %v, want net.ErrClosed", err)
			}
			for op, err := range map[string]error{
				"Read":       func() error { _, err := c.Read(make([]byte, 1)); return err }(),
				"Write":      func() error { _, err := c.Write([]byte("x")); return err }(),
				"WriteTo":    func() error { _, err := c.(io.WriterTo).WriteTo(io.Discard); return err }(),
				"CloseWrite": c.(closeWriter).CloseWrite(),
				"Close":      c.Close(),
			} {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("%s after Close: %v, want net.ErrClosed", op, err)
				}
				var oe *net.OpError
				if !errors.As(err, &oe) || oe.Net != name {
					t.Errorf("%s after Close: %v, want a *net.OpError naming %s", op, err, name)
				}
			}
			// The peer sees a clean EOF: Close came between frames.
			if _, err := s.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("peer Read: %v, want io.EOF", err)
			}
		})
	}
}

// TestEnds checks how each way of ending a connection reaches the peer,
// which reads everything first: Close and CloseWrite end the stream
// cleanly (Close even when the peer is slow to read and the end frame
// must wait), while Abort, a Close that cuts a Write short, and a
// connection that ends under the layer without an end frame are errors,
// never io.EOF.
func TestEnds(t *testing.T) {
	data := testnet.RandomBytes(8<<20, 3) // more than the socket buffers hold
	for _, tc := range []struct {
		name   string
		end    func(c net.Conn, below *net.TCPConn) // after a Write of data, or during it
		during bool                                 // end while the Write still runs
		clean  bool                                 // the peer must read io.EOF after data
	}{
		{"Close", func(c net.Conn, _ *net.TCPConn) { c.Close() }, false, true},
		{"CloseWrite", func(c net.Conn, _ *net.TCPConn) { c.(closeWriter).CloseWrite() }, false, true},
		{"Abort", func(c net.Conn, _ *net.TCPConn) { c.(netconn.Aborter).Abort() }, false, false},
		{"netconn.Abort", func(c net.Conn, _ *net.TCPConn) { netconn.Abort(c) }, false, false},
		{"the connection below closed", func(_ net.Conn, below *net.TCPConn) { below.Close() }, false, false},
		{"Close during a Write", func(c net.Conn, _ *net.TCPConn) { c.Close() }, true, false},
	} {
		for _, name := range append([]string{"adaptive"}, codecNames...) {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				a, b := testnet.TCPPair(t)
				var f layer.Filter = mustAuto(t, AutoConfig{})
				if name != "adaptive" {
					f = mustNew(t, name, defaultLevel(name))
				}
				c, _ := f.Client(a)
				s, _ := f.Server(b)
				defer s.Close()
				defer c.Close()
				// The peer reads as the data comes, so the end is sent while
				// the socket buffers are full: Close's end frame waits. It
				// reads only after the end when that must cut a Write.
				ended := make(chan struct{})
				type result struct {
					got []byte
					err error
				}
				read := make(chan result, 1)
				go func() {
					if tc.during {
						<-ended
					}
					s.SetReadDeadline(time.Now().Add(10 * time.Second))
					got, err := io.ReadAll(s)
					read <- result{got, err}
				}()
				wrote := make(chan error, 1)
				go func() { _, err := c.Write(data); wrote <- err }()
				if tc.during {
					time.Sleep(50 * time.Millisecond) // the Write blocks: nobody reads
				} else if err := <-wrote; err != nil {
					t.Fatal(err)
				}
				tc.end(c, a)
				close(ended)
				r := <-read
				got, err := r.got, r.err
				switch {
				case tc.clean && (err != nil || !bytes.Equal(got, data)):
					t.Fatalf("peer read %d of %d bytes, then %v; want them all, then io.EOF", len(got), len(data), err)
				case !tc.clean && err == nil:
					t.Fatalf("peer read %d of %d bytes, then a clean end; want an error", len(got), len(data))
				case !tc.clean && errors.Is(err, os.ErrDeadlineExceeded):
					t.Fatalf("peer read %d of %d bytes, then nothing for 10 s; want an error", len(got), len(data))
				case !tc.clean && !tc.during && !bytes.Equal(got, data[:len(got)]):
					t.Fatalf("peer read %d bytes that differ from what was sent", len(got))
				}
				if !tc.clean {
					t.Logf("peer read %d of %d bytes, then %v", len(got), len(data), err)
				}
				if tc.during {
					if err := <-wrote; !errors.Is(err, net.ErrClosed) {
						t.Errorf("the Write Close cut short: %v, want net.ErrClosed", err)
					}
				}
			})
		}
	}
}

func TestCloseWrite(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			a, b := testnet.TCPPair(t)
			f := mustNew(t, name, defaultLevel(name))
			c, _ := f.Client(a)
			s, _ := f.Server(b)
			defer c.Close()
			defer s.Close()
			c.Write([]byte("ping"))
			if err := c.(closeWriter).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if err := c.(closeWriter).CloseWrite(); err != nil {
				t.Fatalf("second CloseWrite: %v", err)
			}
			if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Write after CloseWrite: %v, want net.ErrClosed", err)
			}
			got, err := io.ReadAll(s)
			if err != nil || string(got) != "ping" {
				t.Fatalf("server read %q, %v", got, err)
			}
			// The other direction still works.
			if _, err := s.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			s.(closeWriter).CloseWrite()
			got, err = io.ReadAll(c)
			if err != nil || string(got) != "pong" {
				t.Fatalf("client read %q, %v", got, err)
			}
		})
	}
}

func TestAddrs(t *testing.T) {
	a, b := testnet.TCPPair(t)
	f := mustNew(t, "zstd", 3)
	c, _ := f.Client(a)
	defer c.Close()
	defer b.Close()
	if c.LocalAddr().String() != a.LocalAddr().String() || c.RemoteAddr().String() != a.RemoteAddr().String() {
		t.Fatalf("addresses %v %v, want %v %v", c.LocalAddr(), c.RemoteAddr(), a.LocalAddr(), a.RemoteAddr())
	}
}

// TestCompresses checks that text goes compressed and random bytes raw,
// and that small writes leave at once, one frame each.
func TestCompresses(t *testing.T) {
	text, random := textCorpus(4<<20), testnet.RandomBytes(4<<20, 7)
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			if wire := encode(t, name, defaultLevel(name), text); len(wire) > len(text)/2 {
				t.Errorf("text: %d bytes on the wire for %d", len(wire), len(text))
			}
			wire := encode(t, name, defaultLevel(name), random)
			frames := (len(random) + MaxBlock - 1) / MaxBlock
			if len(wire) != len(random)+frames*headerSize {
				t.Errorf("random: %d bytes on the wire for %d, want raw frames", len(wire), len(random))
			}
			var rec bytes.Buffer
			c := newConn(&testnet.FakeConn{W: &rec}, name, mustNew(t, name, defaultLevel(name)).codec)
			for i := range 3 {
				msg := text[:200+i]
				c.Write(msg)
				if rec.Len() == 0 {
					t.Fatal("a small Write was held back")
				}
				var h header
				copy(h[:], rec.Next(headerSize))
				if h.RawLen() != len(msg) || rec.Len() != h.PayloadLen() {
					t.Fatalf("Write of %d bytes: frame of %d raw bytes, %d on the wire, %d-byte payload", len(msg), h.RawLen(), rec.Len(), h.PayloadLen())
				}
				rec.Reset()
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	c := newConn(&testnet.FakeConn{}, "zstd", mustNew(t, "zstd", 3).codec)
	random, text := testnet.RandomBytes(200*MaxBlock, 7), textCorpus(MaxBlock)
	attempts := 0
	for i := 0; i < 200; i++ {
		if c.skip == 0 {
			attempts++
		}
		c.Write(random[i*MaxBlock : (i+1)*MaxBlock])
	}
	// Tries at blocks 0, 2, 5, 10, 19, 36, 69, 134 and 199.
	if attempts != 9 {
		t.Errorf("%d compression attempts on 200 random blocks", attempts)
	}
	// Text is compressed again after at most maxBackoff blocks.
	var wire bytes.Buffer
	c.c = &testnet.FakeConn{W: &wire}
	for i := 0; i <= maxBackoff; i++ {
		wire.Reset()
		c.Write(text)
	}
	if wire.Len() > len(text)/2 {
		t.Errorf("text still raw after %d blocks", maxBackoff+1)
	}
}

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		codec string
		level int
		ok    bool
	}{
		{"zstd", 1, true}, {"zstd", 22, true}, {"zstd", 0, false}, {"zstd", 23, false},
		{"s2", 3, true}, {"s2", 4, false}, {"deflate", 9, true}, {"deflate", 0, false},
		{"lz4", 0, true}, {"lz4", 9, true}, {"lz4", -1, false}, {"brotli", 1, false},
	} {
		t.Run(fmt.Sprintf("%s-%d", tc.codec, tc.level), func(t *testing.T) {
			_, err := New(tc.codec, tc.level)
			if (err == nil) != tc.ok {
				t.Fatalf("New = %v, want ok=%t", err, tc.ok)
			}
		})
	}
}

// TestLevels round-trips text at every level of every codec.
func TestLevels(t *testing.T) {
	text := textCorpus(MaxBlock + 1000)
	for _, s := range codecSpecs {
		for level := s.minLevel; level <= s.maxLevel; level++ {
			t.Run(fmt.Sprintf("%s-%d", s.name, level), func(t *testing.T) {
				wire := encode(t, s.name, level, text)
				got, err := io.ReadAll(newConn(&testnet.FakeConn{R: bytes.NewReader(ended(wire))}, s.name, mustNew(t, s.name, level).codec))
				if err != nil || !bytes.Equal(got, text) {
					t.Fatalf("round trip: %d bytes, %v", len(got), err)
				}
				if len(wire) > len(text)/2 {
					t.Errorf("%d bytes on the wire for %d", len(wire), len(text))
				}
			})
		}
	}
}

func TestRegistered(t *testing.T) {
	for _, s := range codecSpecs {
		spec, ok := layer.Lookup(s.name)
		if !ok {
			t.Fatalf("%s not registered", s.name)
		}
		if spec.Kind != layer.KindFilter || len(spec.Params) != 1 {
			t.Fatalf("%s: kind %v, %d params", s.name, spec.Kind, len(spec.Params))
		}
		p := spec.Params[0]
		if p.Name != "level" || p.Type != layer.TypeInt || !p.Local || p.Min != int64(s.minLevel) || p.Max != int64(s.maxLevel) || p.Default != fmt.Sprint(s.defLevel) {
			t.Errorf("%s: level param %+v", s.name, p)
		}
		if !strings.Contains(spec.Summary, s.name) && !strings.Contains(strings.ToLower(spec.Summary), s.name) {
			t.Errorf("%s: summary %q does not name it", s.name, spec.Summary)
		}
	}
}

// TestNoAllocs checks that writing and reading frames allocates nothing
// once the pools are warm: compressed and raw frames, through Read and
// WriteTo.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	text, random := textCorpus(3*MaxBlock), testnet.RandomBytes(2*MaxBlock, 7)
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			codec := mustNew(t, name, defaultLevel(name)).codec
			w := newConn(&testnet.FakeConn{W: io.Discard}, name, codec)
			w.vectored = true
			wire := ended(encode(t, name, defaultLevel(name), text, random, text[:100]))
			src := bytes.NewReader(wire)
			eof := testnet.NewEOFSignal(src)
			r := newConn(&testnet.FakeConn{R: eof}, name, codec)
			buf := make([]byte, 256<<10)
			// The end frame starts the tail reader
			// (framed.Ends.PeerEnded), which reads src to its end: the
			// rounds read src again once it is done.
			r.WriteTo(io.Discard)
			eof.Wait(t)
			allocs := testing.AllocsPerRun(20, func() {
				w.skip, w.backoff = 0, 0 // compress every time
				w.Write(text)
				w.Write(random)
				w.Write(text[:100])
				src.Reset(wire)
				r.rerr = nil
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
				src.Reset(wire)
				r.rerr = nil
				r.WriteTo(io.Discard)
			})
			if allocs >= 1 {
				t.Errorf("%.1f allocations per round", allocs)
			}
		})
	}
}

// TestCloseAfterPeerEnd: a side that read the peer's end frame, answered
// and closed must not leave the bytes of the layer below's own end
// unread: closing a socket with unread bytes makes the kernel reset the
// connection and throw away what it had not sent yet, so the peer got a
// reset in the middle of the answer (TestEncryptedBeyondLoopback, one CI
// run in many: zstd over noise).
func TestCloseAfterPeerEnd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		closeWrite bool // as a relay ends: CloseWrite, then Close
	}{{"close", false}, {"closewrite", true}} {
		for _, name := range codecNames {
			t.Run(tc.name+"/"+name, func(t *testing.T) { closeAfterPeerEnd(t, name, tc.closeWrite) })
		}
	}
}

func closeAfterPeerEnd(t *testing.T, name string, closeWrite bool) {
	// Small buffers: the answer is still on its way when the
	// server closes.
	a, b := testnet.TCPPairBuffers(t, 16<<10, 64<<10)
	defer a.Close()
	defer b.Close()
	f := mustNew(t, name, defaultLevel(name))
	c, _ := f.Client(testnet.TrailerConn{TCPConn: a})
	s, _ := f.Server(b)
	if _, err := c.Write([]byte("question")); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() { shut <- c.(closeWriter).CloseWrite() }()
	if q, err := io.ReadAll(s); err != nil || string(q) != "question" {
		t.Fatalf("server read %q, %v", q, err)
	}
	answer := testnet.RandomBytes(4<<20, 7)
	done := make(chan error, 1)
	go func() {
		_, err := s.Write(answer)
		if closeWrite && err == nil {
			err = s.(closeWriter).CloseWrite()
		}
		if cerr := s.Close(); err == nil {
			err = cerr
		}
		done <- err
	}()
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the trailer is in the server's socket, unread
	// The client reads all but the answer's last 100 KiB, which the
	// buffers hold, and waits: the server's Write returns and it closes
	// with them still on their way.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(answer)-100<<10)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("client read: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	rest, err := io.ReadAll(c)
	got = append(got, rest...)
	if err != nil || !bytes.Equal(got, answer) {
		t.Errorf("client read %d of %d bytes of the answer: %v", len(got), len(answer), err)
	}
	if err := <-done; err != nil {
		t.Errorf("server: %v", err)
	}
	c.Close()
}

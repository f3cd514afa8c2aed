package quic

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"
)

// receiptsOf returns the receipt state of c's path (nil for vlink/1).
func receiptsOf(c net.Conn) *receipts { return c.(*conn).p.rc }

// awaits reports whether c's path awaits a receipt.
func awaits(c net.Conn) bool {
	select {
	case <-receiptsOf(c).done():
		return false
	default:
		return true
	}
}

// TestReceipts: on a vlink/2 path, a stream closed for writing awaits
// the peer's receipt until the peer read it to its end, or closed or
// aborted it; a stream this side aborted awaits nothing. Both ways: a
// dialer's and a listener's streams.
func TestReceipts(t *testing.T) {
	f := newFactory(t, Options{})
	l := listen(t, f)
	data := make([]byte, 256<<10)
	write := func(t *testing.T, w net.Conn) {
		t.Helper()
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	closeAwaiting := func(t *testing.T, w net.Conn, closeWrite bool) {
		t.Helper()
		var err error
		if closeWrite {
			err = w.(interface{ CloseWrite() error }).CloseWrite()
		} else {
			err = w.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
		if !awaits(w) {
			t.Fatal("no receipt awaited for a stream closed with its data unread")
		}
	}
	readAll := func(t *testing.T, r net.Conn) {
		t.Helper()
		n, err := io.Copy(io.Discard, r)
		if err != nil || n != int64(len(data)) {
			t.Fatalf("read %d bytes, %v", n, err)
		}
	}
	cases := []struct {
		name string
		run  func(t *testing.T, w, r net.Conn) // w writes, r reads
	}{
		{"read to the end", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			closeAwaiting(t, w, false)
			readAll(t, r)
		}},
		{"CloseWrite, read to the end", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			closeAwaiting(t, w, true)
			readAll(t, r)
		}},
		{"reader closes", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			closeAwaiting(t, w, false)
			r.Close()
		}},
		{"reader closed first", func(t *testing.T, w, r net.Conn) {
			r.Close()
			time.Sleep(50 * time.Millisecond) // the receipt comes before the FIN
			w.Close()
		}},
		{"reader aborts", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			closeAwaiting(t, w, false)
			r.(interface{ Abort() error }).Abort()
		}},
		{"writer aborts", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			w.(interface{ Abort() error }).Abort()
		}},
		{"writer aborts after CloseWrite", func(t *testing.T, w, r net.Conn) {
			write(t, w)
			closeAwaiting(t, w, true)
			w.(interface{ Abort() error }).Abort()
		}},
	}
	for _, side := range []string{"dialer writes", "listener writes"} {
		for _, tc := range cases {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				w, r := mustPair(t, f, l)
				if side == "listener writes" {
					w, r = r, w
				}
				if receiptsOf(w) == nil || receiptsOf(r) == nil {
					t.Fatal("vlink/2 was not negotiated")
				}
				tc.run(t, w, r)
				select {
				case <-receiptsOf(w).done():
				case <-time.After(5 * time.Second):
					t.Fatal("a receipt is still awaited 5 s later")
				}
			})
		}
	}
}

// TestReceiptsOldPeer: with a vlink/1 peer, either way, streams work
// and nothing waits for receipts: CloseAll returns at once with a
// stream's data unread.
func TestReceiptsOldPeer(t *testing.T) {
	for _, tc := range []struct {
		name             string
		dialer, listener []string
	}{
		{"old dialer", []string{alpnV1}, []string{alpnV2, alpnV1}},
		{"old listener", []string{alpnV2, alpnV1}, []string{alpnV1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lf := newFactory(t, Options{})
			lf.protos = tc.listener
			l := listen(t, lf)
			df := newFactory(t, Options{})
			df.protos = tc.dialer
			a, b := mustPair(t, df, l)
			if receiptsOf(a) != nil || receiptsOf(b) != nil {
				t.Fatal("vlink/2 negotiated with a vlink/1 peer")
			}
			checkEcho(t, a, b)
			checkEcho(t, b, a)
			for _, c := range []net.Conn{a, b} {
				if _, err := c.Write(make([]byte, 256<<10)); err != nil {
					t.Fatal(err)
				}
				c.(interface{ CloseWrite() error }).CloseWrite()
			}
			start := time.Now()
			CloseAll()
			if took := time.Since(start); took > time.Second {
				t.Errorf("CloseAll took %v with a vlink/1 peer, want no wait", took)
			}
		})
	}
}

// TestExitDeadPeer: CloseAll waits for a receipt that cannot come (the
// peer stopped answering) about ExitWait, not the idle timeout.
func TestExitDeadPeer(t *testing.T) {
	const idle = 10 * time.Second
	f := newFactory(t, Options{IdleTimeout: idle})
	l := listen(t, f)
	r := newUDPRelay(t, l.Addr().String())
	acc := acc2(l)
	a, err := f.DialContext(context.Background(), "tcp", r.pc.LocalAddr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := <-acc
	defer b.Close()
	if _, err := a.Write(make([]byte, 256<<10)); err != nil { // within the initial window: unread
		t.Fatal(err)
	}
	a.Close()
	r.drop.Store(true)
	start := time.Now()
	CloseAll()
	if took := time.Since(start); took < ExitWait-100*time.Millisecond || took > ExitWait+2*time.Second {
		t.Errorf("CloseAll with a dead peer took %v, want about ExitWait (%v); the idle timeout is %v", took, ExitWait, idle)
	}
}

const (
	exitHelperEnv = "VLINK_QUIC_EXIT_HELPER" // the helper's role: dial or listen
	exitAddrEnv   = "VLINK_QUIC_EXIT_ADDR"   // where the dialing helper dials
	exitSize      = 16 << 20
)

// exitData is what the helper sends.
func exitData() []byte {
	b := make([]byte, exitSize)
	rand.NewChaCha8([32]byte{'v', 'l', 'i', 'n', 'k'}).Read(b)
	return b
}

// TestExitKeepsClosedStreams: a process that writes 16 MiB on a stream,
// closes it, calls CloseAll and exits at once loses none of it, though
// the reader is slow with the end and the path loses 2% of its datagrams
// (the retransmissions are the exiting process's to send), whether it
// dialed or accepted the stream.
func TestExitKeepsClosedStreams(t *testing.T) {
	if os.Getenv(exitHelperEnv) != "" {
		t.Skip("in the helper")
	}
	want := sha256.Sum256(exitData())
	for _, role := range []string{"dial", "listen"} {
		t.Run("helper "+role+"s", func(t *testing.T) {
			f := newFactory(t, Options{})
			helper := exec.Command(os.Args[0], "-test.run=^TestExitHelper$", "-test.count=1")
			helper.Env = append(os.Environ(), exitHelperEnv+"="+role)
			var stderr bytes.Buffer
			helper.Stderr = &stderr
			var c net.Conn
			var err error
			if role == "dial" {
				l := listen(t, f)
				r := newUDPRelay(t, l.Addr().String())
				r.loss.Store(20)
				helper.Env = append(helper.Env, exitAddrEnv+"="+r.pc.LocalAddr().String())
				if err := helper.Start(); err != nil {
					t.Fatal(err)
				}
				defer helper.Wait()
				acc := acc2(l)
				select {
				case c = <-acc:
				case <-time.After(20 * time.Second):
					helper.Process.Kill()
					t.Fatalf("the helper did not dial: %s", stderr.Bytes())
				}
			} else {
				out, err := helper.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := helper.Start(); err != nil {
					t.Fatal(err)
				}
				defer helper.Wait()
				line, err := bufio.NewReader(out).ReadString('\n')
				if err != nil {
					helper.Process.Kill()
					t.Fatalf("the helper's address: %v: %s", err, stderr.Bytes())
				}
				r := newUDPRelay(t, strings.TrimSpace(line))
				r.loss.Store(20)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if c, err = f.DialContext(ctx, "tcp", r.pc.LocalAddr().String(), nil); err != nil {
					helper.Process.Kill()
					t.Fatal(err)
				}
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			// The last 64 KiB are read half a second late: the helper
			// has sent them by then (the stream's window is larger) and
			// has closed the stream, so a helper that did not wait for
			// them to be read would have taken them with it.
			h := sha256.New()
			n, err := io.CopyN(h, c, exitSize-64<<10)
			if err == nil {
				time.Sleep(500 * time.Millisecond)
				var m int64
				m, err = io.Copy(h, c)
				n += m
			}
			if err != nil || n != exitSize {
				t.Fatalf("read %d of %d bytes from the exiting helper, then %v", n, exitSize, err)
			}
			if [32]byte(h.Sum(nil)) != want {
				t.Fatal("the bytes differ from those sent")
			}
			if err := helper.Wait(); err != nil {
				t.Fatalf("the helper: %v: %s", err, stderr.Bytes())
			}
		})
	}
}

// TestExitHelper is TestExitKeepsClosedStreams's peer, in a process of
// its own: it sends exitData on a stream, closes it, calls CloseAll and
// exits.
func TestExitHelper(t *testing.T) {
	role := os.Getenv(exitHelperEnv)
	if role == "" {
		t.Skip("the helper of TestExitKeepsClosedStreams")
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(2)
	}
	f, err := New(Options{})
	if err != nil {
		fail(err)
	}
	var c net.Conn
	if role == "dial" {
		c, err = f.DialContext(context.Background(), "tcp", os.Getenv(exitAddrEnv), nil)
	} else {
		var l net.Listener
		if l, err = f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil); err != nil {
			fail(err)
		}
		fmt.Println(l.Addr())
		c, err = l.Accept()
	}
	if err != nil {
		fail(err)
	}
	if _, err := c.Write(exitData()); err != nil {
		fail(err)
	}
	c.Close()
	CloseAll()
	os.Exit(0)
}

// FuzzReceipts: a receipt stream is the peer's input. Whatever it is,
// readReceipts does not panic, fails only with errBadReceipt, passes on
// only bidirectional stream IDs, and what it passes on encodes back to
// a stream it decodes the same.
func FuzzReceipts(f *testing.F) {
	var b []byte
	for _, id := range []uint64{0, 1, 4, 63, 64, 16383, 16384, 1<<30 - 1, 1 << 30, quicvarint.Max &^ 3} {
		b = quicvarint.Append(b, id)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x02})                   // a unidirectional stream
	f.Add([]byte{0x40})                   // cut within an ID
	f.Add([]byte{0xc0, 0, 0, 0, 0, 0, 0}) // cut within an 8-byte ID
	f.Add([]byte{0x40, 0x00})             // 0, not minimally encoded
	f.Fuzz(func(t *testing.T, in []byte) {
		var got []quic.StreamID
		err := readReceipts(bytes.NewReader(in), func(id quic.StreamID) { got = append(got, id) })
		if err != nil && !errors.Is(err, errBadReceipt) {
			t.Fatalf("%x: %v, want errBadReceipt", in, err)
		}
		var again []byte
		for _, id := range got {
			if id < 0 || id&2 != 0 || uint64(id) > quicvarint.Max {
				t.Fatalf("%x: passed on stream %d", in, id)
			}
			again = quicvarint.Append(again, uint64(id))
		}
		var back []quic.StreamID
		if err := readReceipts(bytes.NewReader(again), func(id quic.StreamID) { back = append(back, id) }); err != nil || fmt.Sprint(back) != fmt.Sprint(got) {
			t.Fatalf("%x: decoded %v, whose encoding decodes to %v, %v", in, got, back, err)
		}
	})
}

// TestReceiptsBounded: receipts of streams a path does not track cost
// no memory, and the streams tracked are bounded.
func TestReceiptsBounded(t *testing.T) {
	r := &receipts{streams: map[quic.StreamID]receiptState{}, settled: closedChan, wake: make(chan struct{}, 1)}
	r.track(4)
	r.finished(4)
	for id := range quic.StreamID(100000) {
		r.got(id*4 + 8)
	}
	if len(r.streams) != 1 || r.pending != 1 {
		t.Fatalf("after receipts of untracked streams: %d tracked, %d pending; want 1, 1", len(r.streams), r.pending)
	}
	r.got(4)
	if len(r.streams) != 0 || r.pending != 0 {
		t.Fatalf("after the receipt awaited: %d tracked, %d pending", len(r.streams), r.pending)
	}
	select {
	case <-r.done():
	default:
		t.Fatal("settled not closed with nothing pending")
	}
	for id := range quic.StreamID(2 * maxTracked) {
		r.track(id * 4)
	}
	if len(r.streams) != maxTracked {
		t.Fatalf("%d streams tracked, want at most %d", len(r.streams), maxTracked)
	}
}

// TestBadReceipts: a receipt stream that breaks the protocol closes its
// connection with codeBadReceipt; one full of receipts of streams the
// listener does not track costs it nothing and the connection goes on.
func TestBadReceipts(t *testing.T) {
	l := listen(t, newFactory(t, Options{}))
	var many []byte
	for i := range 1 << 17 {
		many = quicvarint.Append(many, uint64(i)*4*1021+1)
	}
	for _, tc := range []struct {
		name   string
		in     []byte
		closes bool
	}{
		{"unidirectional stream", []byte{0x02}, true},
		{"cut within an ID", []byte{0x04, 0x80, 0x01}, true},
		{"receipts of unknown streams", many, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			qc, err := quic.DialAddr(ctx, l.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpnV2}},
				&quic.Config{MaxIdleTimeout: time.Minute, MaxIncomingUniStreams: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer qc.CloseWithError(0, "")
			u, err := qc.OpenUniStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.Write(tc.in); err != nil {
				t.Fatal(err)
			}
			u.Close()
			if tc.closes {
				select {
				case <-qc.Context().Done():
				case <-ctx.Done():
					t.Fatal("the listener kept a connection whose receipts broke the protocol")
				}
				var ae *quic.ApplicationError
				if err := context.Cause(qc.Context()); !errors.As(err, &ae) || ae.ErrorCode != codeBadReceipt {
					t.Fatalf("the connection ended with %v, want code %#x", err, codeBadReceipt)
				}
				return
			}
			// The connection goes on: a stream opened after the
			// receipts is served.
			s, err := qc.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.Write([]byte{streamOpen})
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 1)
			if _, err := io.ReadFull(s, b); err != nil || b[0] != streamOpen {
				t.Fatalf("a stream after the receipts: %x, %v", b, err)
			}
			c, err := l.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rc := receiptsOf(c)
			rc.mu.Lock()
			n := len(rc.streams)
			rc.mu.Unlock()
			if n != 1 {
				t.Fatalf("the listener tracks %d streams, want the one open", n)
			}
		})
	}
}

// TestLingerWaitsForReceipts: a dialer's path outlives its linger while
// the peer has not read a stream closed on it.
func TestLingerWaitsForReceipts(t *testing.T) {
	const linger = 200 * time.Millisecond
	f := newFactory(t, Options{Linger: linger})
	a, b := mustPair(t, f, listen(t, f))
	data := make([]byte, 256<<10)
	if _, err := a.Write(data); err != nil {
		t.Fatal(err)
	}
	a.Close()
	time.Sleep(3 * linger)
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, b); err != nil || n != int64(len(data)) {
		t.Fatalf("read %d of %d bytes %v after the dialer closed, then %v", n, len(data), 3*linger, err)
	}
	p := a.(*conn).p
	select {
	case <-p.qc.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the path is still up 5 s after its stream was read")
	}
}

// TestListenerCloseWaitsForReceipts: a closed listener keeps a
// connection whose last stream was closed until the peer read it: here
// for longer than the drain time, within ExitWait.
func TestListenerCloseWaitsForReceipts(t *testing.T) {
	f := newFactory(t, Options{})
	lis, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, err := pair(t, f, lis)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	data := make([]byte, 256<<10)
	if _, err := b.Write(data); err != nil {
		t.Fatal(err)
	}
	b.Close()
	lis.Close()
	time.Sleep(drainTime + 500*time.Millisecond)
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, a); err != nil || n != int64(len(data)) {
		t.Fatalf("read %d of %d bytes %v after the listener closed, then %v", n, len(data), drainTime+500*time.Millisecond, err)
	}
}

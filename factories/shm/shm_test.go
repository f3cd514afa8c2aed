//go:build linux

package shm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/netconn/framed"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns the two ends of a connection, dialer first.
func pair(t testing.TB, ring int) (net.Conn, net.Conn) {
	t.Helper()
	a, b, err := makePair(filepath.Join(t.TempDir(), "shm"), ring)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func makePair(dir string, ring int) (net.Conn, net.Conn, error) {
	f, err := New(Options{RingSize: ring, Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	type res struct {
		c   net.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		acc <- res{c, err}
	}()
	d, err := f.DialContext(context.Background(), "tcp", l.Addr().String(), nil)
	if err != nil {
		return nil, nil, err
	}
	r := <-acc
	if r.err != nil {
		d.Close()
		return nil, nil, r.err
	}
	return d, r.c, nil
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	n := 0
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		n++
		a, b, err := makePair(filepath.Join(dir, strconv.Itoa(n)), minRingSize)
		if err != nil {
			return nil, nil, nil, err
		}
		return a, b, func() { a.Close(); b.Close() }, nil
	})
}

// TestTransfer moves data through rings smaller than it, both ways at
// once, with half-close, checked by SHA-256: one way by Write and Read,
// the other by ReadFrom and WriteTo.
func TestTransfer(t *testing.T) {
	for _, n := range []int{0, 1, minRingSize - 1, minRingSize + 1, 3 << 20} {
		a, b := pair(t, minRingSize)
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(rand.Uint32())
		}
		want := sha256.Sum256(data)
		var wg sync.WaitGroup
		// One way by Write and Read, the other by ReadFrom and WriteTo.
		check := func(src, dst net.Conn) {
			defer wg.Done()
			go func() {
				if src == a {
					src.Write(data)
				} else {
					src.(io.ReaderFrom).ReadFrom(struct{ io.Reader }{bytes.NewReader(data)})
				}
				src.(*conn).CloseWrite()
			}()
			h := sha256.New()
			var err error
			if dst == b {
				_, err = io.CopyBuffer(h, struct{ io.Reader }{dst}, make([]byte, 1000))
			} else {
				_, err = dst.(io.WriterTo).WriteTo(h)
			}
			if err != nil {
				t.Errorf("%d bytes: %v", n, err)
			}
			if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
				t.Errorf("%d bytes: the checksum differs", n)
			}
		}
		wg.Add(2)
		go check(a, b)
		go check(b, a)
		wg.Wait()
		a.Close()
		b.Close()
	}
}

// TestAbort: an abort, and a peer gone without closing, are errors for
// the reader, never the end of the stream.
func TestAbort(t *testing.T) {
	a, b := pair(t, minRingSize)
	defer b.Close()
	a.Write([]byte("partial"))
	a.(*conn).Abort()
	got, err := io.ReadAll(b)
	if !errors.Is(err, ErrReset) {
		t.Fatalf("read after the peer aborted: %q, %v; want ErrReset", got, err)
	}
	// The one reset every transport and framed layer reports.
	if !errors.Is(err, framed.ErrReset) || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after the peer aborted: %v, want it to match framed.ErrReset and ECONNRESET", err)
	}
	if string(got) != "partial" {
		t.Errorf("read %q before the reset, want %q", got, "partial")
	}
}

// TestWriteAfterCloseWrite: a write after CloseWrite fails as a socket's
// does (EPIPE), and as every framed layer's (framed.ErrWriteShut,
// net.ErrClosed); the other way still works.
func TestWriteAfterCloseWrite(t *testing.T) {
	a, b := pair(t, minRingSize)
	defer a.Close()
	defer b.Close()
	if err := a.(*conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_, err := a.Write([]byte("x"))
	if !errors.Is(err, syscall.EPIPE) || !errors.Is(err, net.ErrClosed) || !errors.Is(err, framed.ErrWriteShut) {
		t.Errorf("Write after CloseWrite: %v, want framed.ErrWriteShut (EPIPE, net.ErrClosed)", err)
	}
	go b.Write([]byte("back"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(a, got); err != nil || string(got) != "back" {
		t.Errorf("read %q, %v the other way", got, err)
	}
}

func TestDeadline(t *testing.T) {
	a, b := pair(t, minRingSize)
	defer a.Close()
	defer b.Close()
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := b.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a timeout", err)
	}
}

func BenchmarkPingPong(b *testing.B) {
	x, y := pair(b, DefaultRingSize)
	defer x.Close()
	defer y.Close()
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := y.Read(buf); err != nil {
				return
			}
			y.Write(buf)
		}
	}()
	buf := make([]byte, 1)
	b.ResetTimer()
	for range b.N {
		x.Write(buf)
		x.Read(buf)
	}
}

// TestPortHeld: a listener on port 0 holds its port's number on TCP, so
// that no TCP listener takes it and sees its dialers sent here.
func TestPortHeld(t *testing.T) {
	f, err := New(Options{Dir: filepath.Join(t.TempDir(), "shm")})
	if err != nil {
		t.Fatal(err)
	}
	l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if tl, err := net.Listen("tcp", l.Addr().String()); err == nil {
		tl.Close()
		t.Fatalf("a TCP listener took %s beside the shared-memory one", l.Addr())
	}
	l.Close()
	tl, err := net.Listen("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("the port is still held after Close: %v", err)
	}
	tl.Close()
}

// TestNamed: a listener found by its name carries bytes as a port's
// does; names that could leave the folder, or pose as a port's, are
// refused; a name no one listens on fails at once; Close removes it.
func TestNamed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	f, err := New(Options{Dir: dir, RingSize: minRingSize})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", ".hidden", "../up", "a/b", "shm-7000", "a b", strings.Repeat("x", MaxName+1)} {
		if l, err := f.ListenName(name); !errors.Is(err, ErrBadName) {
			if err == nil {
				l.Close()
			}
			t.Errorf("ListenName(%q) = %v, want ErrBadName", name, err)
		}
		if _, err := f.DialName(context.Background(), name); !errors.Is(err, ErrBadName) {
			t.Errorf("DialName(%q) = %v, want ErrBadName", name, err)
		}
	}
	name := "job-0123abcd-rank3"
	start := time.Now()
	if _, err := f.DialName(context.Background(), name); !errors.Is(err, os.ErrNotExist) || time.Since(start) > time.Second {
		t.Fatalf("dialing a name no one listens on: %v after %v, want a missing socket at once", err, time.Since(start))
	}
	l, err := f.ListenName(name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr().String() != name {
		t.Errorf("Addr = %v, want %s", l.Addr(), name)
	}
	data := make([]byte, 3*minRingSize+5)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	got := make(chan [32]byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
			got <- [32]byte{}
			return
		}
		defer c.Close()
		b, err := io.ReadAll(c)
		if err != nil {
			t.Error(err)
		}
		got <- sha256.Sum256(b)
	}()
	c, err := f.DialName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if <-got != sha256.Sum256(data) {
		t.Error("the bytes through a named listener differ from those sent")
	}
	l.Close()
	if _, err := os.Stat(filepath.Join(dir, name+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket after Close: %v, want it removed", err)
	}
}

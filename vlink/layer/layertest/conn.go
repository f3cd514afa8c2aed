package layertest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/netconn"
)

// testErrors checks the errors a program sees: timeouts wrap
// os.ErrDeadlineExceeded, use after Close is net.ErrClosed, and the
// peer of a closed end reads a clean end.
func testErrors(t *testing.T, mp MakePipe) {
	p := pipe(t, mp)
	c1, c2 := p.Dialer, p.Acceptor
	c1.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var ne net.Error
	if _, err := c1.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past deadline = %v, want os.ErrDeadlineExceeded and Timeout()", err)
	}
	c1.SetReadDeadline(time.Time{})
	// After a timeout the connection still works.
	go c2.Write([]byte("x"))
	if _, err := io.ReadFull(c1, make([]byte, 1)); err != nil {
		t.Fatalf("read after a timeout: %v", err)
	}
	c1.Close()
	if _, err := c1.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close = %v, want net.ErrClosed", err)
	}
	if _, err := c1.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close = %v, want net.ErrClosed", err)
	}
	// The peer sees the end of the stream: a clean one, since nothing
	// was left unread, and not just its own deadline.
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c2.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("peer read %d bytes, %v after Close; want io.EOF", n, err)
	}
}

// testTransfer moves size bytes each way at once, each end half-closing
// when done, and checks each direction's SHA-256.
func testTransfer(t *testing.T, mp MakePipe, size int64) {
	p := pipe(t, mp)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, pair := range [][2]net.Conn{{p.Dialer, p.Acceptor}, {p.Acceptor, p.Dialer}} {
		src, dst := pair[0], pair[1]
		seed := uint64(i + 1)
		wg.Add(2)
		sent := make(chan [32]byte, 1)
		go func() {
			defer wg.Done()
			h := sha256.New()
			_, err := io.Copy(io.MultiWriter(src, h), io.LimitReader(newData(seed), size))
			if err == nil {
				err = closeWrite(src)
			}
			if err != nil {
				// The reader would wait for an end that never comes.
				src.Close()
				dst.Close()
			}
			sent <- [32]byte(h.Sum(nil))
			errs <- err
		}()
		go func() {
			defer wg.Done()
			h := sha256.New()
			n, err := io.Copy(h, dst)
			if err == nil && n != size {
				err = fmt.Errorf("received %d bytes, sent %d", n, size)
			}
			if err == nil && [32]byte(h.Sum(nil)) != <-sent {
				err = errors.New("SHA-256 of the received bytes differs from the sent ones")
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
}

// closeWrite half-closes c, which every layer's connection can do.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(netconn.CloseWriter); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("%T has no CloseWrite", c)
}

// newData returns an endless deterministic stream mixing text-like and
// random stretches, so compressors meet both kinds in one transfer.
func newData(seed uint64) io.Reader {
	return &dataReader{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

type dataReader struct {
	rng  *rand.Rand
	left []byte
}

const logLine = `2026-11-22T07:28:43Z INFO request handled method=GET path=/api/v1/items/%d status=200 bytes=%d dur=%dus {"user":"u%d","ok":true}` + "\n"

func (r *dataReader) Read(p []byte) (int, error) {
	if len(r.left) == 0 {
		if r.rng.IntN(4) == 0 {
			b := make([]byte, 16<<10)
			for i := 0; i+8 <= len(b); i += 8 {
				v := r.rng.Uint64()
				for j := 0; j < 8; j++ {
					b[i+j] = byte(v >> (8 * j))
				}
			}
			r.left = b
		} else {
			var sb strings.Builder
			for sb.Len() < 16<<10 {
				fmt.Fprintf(&sb, logLine, r.rng.IntN(1e6), r.rng.IntN(1e5), r.rng.IntN(1e4), r.rng.IntN(100))
			}
			r.left = []byte(sb.String())
		}
	}
	n := copy(p, r.left)
	r.left = r.left[n:]
	return n, nil
}

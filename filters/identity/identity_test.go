package identity

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNettest(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := testnet.TCPPair(t)
		c1, _ = Filter{}.Client(a)
		c2, _ = Filter{}.Server(b)
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

// TestTransfer sends data both ways through the filter, with half-close,
// over every copy path: Write/Read, ReadFrom and WriteTo.
func TestTransfer(t *testing.T) {
	for _, size := range []int{0, 1, 64<<10 - 1, 64 << 10, 64<<10 + 1, 3<<20 + 5} {
		for _, path := range []string{"ReadWrite", "ReadFromWriteTo"} {
			t.Run(fmt.Sprintf("%s/%d", path, size), func(t *testing.T) {
				data := make([]byte, size)
				rand.NewChaCha8([32]byte{1}).Read(data)
				a, b := testnet.TCPPair(t)
				c, _ := Filter{}.Client(a)
				s, _ := Filter{}.Server(b)
				defer c.Close()
				defer s.Close()
				done := make(chan error, 1)
				go func() {
					var err error
					if path == "ReadWrite" {
						_, err = c.Write(data)
					} else {
						_, err = c.(io.ReaderFrom).ReadFrom(bytes.NewReader(data))
					}
					if err == nil {
						err = c.(interface{ CloseWrite() error }).CloseWrite()
					}
					done <- err
				}()
				var got bytes.Buffer
				var err error
				if path == "ReadWrite" {
					_, err = io.Copy(&got, struct{ io.Reader }{s})
				} else {
					_, err = s.(io.WriterTo).WriteTo(&got)
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if sha256.Sum256(got.Bytes()) != sha256.Sum256(data) {
					t.Fatalf("got %d bytes, want %d with the same SHA-256", got.Len(), len(data))
				}
			})
		}
	}
}

func TestCloseWriteUnsupported(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c, _ := Filter{}.Client(a)
	defer c.Close()
	err := c.(interface{ CloseWrite() error }).CloseWrite()
	var oe *net.OpError
	if !errors.Is(err, errors.ErrUnsupported) || !errors.As(err, &oe) || oe.Net != "identity" {
		t.Fatalf("CloseWrite over net.Pipe: %v, want a *net.OpError matching errors.ErrUnsupported", err)
	}
}

func TestRegistered(t *testing.T) {
	spec, ok := layer.Lookup("identity")
	if !ok || spec.Kind != layer.KindFilter || len(spec.Params) != 0 {
		t.Fatalf("identity: %+v, %t", spec, ok)
	}
}

// TestAbort: an abort through the filter resets the TCP connection, so
// the peer sees an error, not a clean end of stream.
func TestAbort(t *testing.T) {
	a, b := testnet.TCPPair(t)
	c, _ := Filter{}.Client(a)
	c.Write([]byte("x"))
	io.ReadFull(b, make([]byte, 1))
	netconn.Abort(c)
	if _, err := io.ReadAll(b); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the peer read to %v, want a reset", err)
	}
}

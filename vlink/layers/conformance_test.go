package layers_test

import (
	"context"
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

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A fixture gives the stack a layer is tested with, starting whatever the
// layer needs (a proxy, an SSH server) and stopping it through t.Cleanup.
// Layers that need more than their defaults add theirs to fixtures from
// their own file (conformance_NAME_test.go), in an init function.
type fixture func(t *testing.T) vlink.Stack

var fixtures = map[string]fixture{}

// A venue is where a stack's pipes are made. The zero venue is a vlink
// listener on a loopback port, dialed at its address; the factories
// that reach nodes need a vlink network (conformance_rendezvous_test.go),
// and those with a transport of their own (shm) a listener on it, which
// they add to venues, like fixtures, under their layer's name.
type venue struct {
	// listen returns the listener the vlink listener wraps, and the
	// address to dial it at.
	listen func() (net.Listener, string, error)
	// network is the dialer's Network.
	network vlink.NodeDialer
	// targets are what the listener's policy lets a hello name.
	targets []selector.Rule
}

var venues = map[string]func(t *testing.T) venue{}

// A subject is a stack to test and where to test it.
type subject struct {
	stack vlink.Stack
	venue venue
}

// stacks returns one stack per registered layer, so a layer is covered the
// day it registers. Filters, multi-link layers and terminal factories are
// tested with their defaults; any other layer must have a fixture, and a
// factory that reaches nodes a venue: the test fails until it has one.
func stacks(t *testing.T) map[string]subject {
	out := map[string]subject{}
	for _, spec := range layer.Specs() {
		var v venue
		if mk, ok := venues[spec.Name]; ok {
			v = mk(t)
		} else if spec.Nodes {
			t.Errorf("layer %s reaches nodes and has no venue: add one to vlink/layers (conformance_%s_test.go)", spec.Name, spec.Name)
			continue
		}
		switch fx, ok := fixtures[spec.Name]; {
		case ok:
			out[spec.Name] = subject{fx(t), v}
		case spec.Kind == layer.KindFilter, spec.Kind == layer.KindMultiLink:
			out[spec.Name] = subject{vlink.MustParse(spec.Name), v}
		case spec.Kind == layer.KindFactory && spec.Terminal:
			out[spec.Name] = subject{vlink.MustParse(spec.Name), v}
		default:
			t.Errorf("layer %s (%s) has no conformance fixture: add one to vlink/layers (conformance_%s_test.go)", spec.Name, spec.Kind, spec.Name)
		}
	}
	// Deeper stacks, so layering itself is covered.
	deeper := func(s string) { out[s] = subject{stack: vlink.MustParse(s)} }
	deeper("zstd+identity+lz4")
	if _, ok := layer.Lookup("parallel"); ok {
		deeper("lz4+parallel:streams=3+zstd")
	}
	if _, ok := layer.Lookup("mux"); ok {
		deeper("zstd+mux+parallel:streams=2")
	}
	if _, ok := layer.Lookup("noise"); ok {
		// Compression above encryption.
		deeper("zstd+noise")
		deeper("noise+mux+noise")
	}
	return out
}

// testKey is the pre-shared key of both sides for stacks with a layer
// that needs one (noise).
var testKey = []byte("conformance pre-shared key")

func needsKey(s vlink.Stack) bool {
	for _, l := range s.Layers {
		if spec, ok := layer.Lookup(l.Name); ok {
			if v, err := spec.Build(l.Params); err == nil {
				if _, ok := v.(layer.HandshakeFilter); ok {
					return true
				}
			}
		}
	}
	return false
}

// pipe makes a connected pair through a subject's stack, at its venue:
// the dialed end and the accepted end, each as a program gets it.
func pipe(t testing.TB, s subject) (c1, c2 net.Conn, stop func(), err error) {
	var key []byte
	if needsKey(s.stack) {
		key = testKey
	}
	listen := s.venue.listen
	if listen == nil {
		listen = func() (net.Listener, string, error) {
			l, err := vlink.ListenStack(context.Background(), vlink.Stack{}, "tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return l, l.Addr().String(), nil
		}
	}
	inner, addr, err := listen()
	if err != nil {
		return nil, nil, nil, err
	}
	lc := vlink.ListenConfig{Policy: vlink.Policy{Key: key, Targets: s.venue.targets}}
	l, err := lc.NewListener(inner)
	if err != nil {
		inner.Close()
		return nil, nil, nil, err
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	// The Dialer keeps what multi-link layers share (a mux session)
	// until it is closed.
	d := &vlink.Dialer{Stack: s.stack, Key: key, Network: s.venue.network}
	c1, err = d.Dial("tcp", addr)
	if err != nil {
		l.Close()
		<-ch
		d.Close()
		return nil, nil, nil, err
	}
	r := <-ch
	l.Close()
	if r.err != nil {
		c1.Close()
		d.Close()
		return nil, nil, nil, r.err
	}
	return c1, r.c, func() { c1.Close(); r.c.Close(); d.Close() }, nil
}

// TestConn runs golang.org/x/net/nettest's net.Conn conformance suite
// (deadlines past, present and future, concurrent I/O, Close unblocking)
// on every stack the registry can build, from both ends.
func TestConn(t *testing.T) {
	for name, s := range stacks(t) {
		t.Run(name, func(t *testing.T) {
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return pipe(t, s) })
		})
	}
}

// TestErrors checks the errors a program sees: timeouts wrap
// os.ErrDeadlineExceeded, use after Close is net.ErrClosed.
func TestErrors(t *testing.T) {
	for name, s := range stacks(t) {
		t.Run(name, func(t *testing.T) {
			c1, c2, stop, err := pipe(t, s)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
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
			// The peer sees the end of the stream: a clean one, since
			// nothing was left unread, and not just its own deadline.
			c2.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := c2.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("peer read %d bytes, %v after Close; want io.EOF", n, err)
			}
		})
	}
}

// TestTransfers moves 0 bytes to hundreds of MiB through every stack, in
// both directions at once, each side half-closing when done, and checks
// each direction's SHA-256.
func TestTransfers(t *testing.T) {
	sizes := []int64{0, 1, 65535, 65537, 3<<20 + 11}
	if !testing.Short() {
		sizes = append(sizes, 200<<20)
	}
	for name, s := range stacks(t) {
		for _, size := range sizes {
			t.Run(fmt.Sprintf("%s/%d", name, size), func(t *testing.T) {
				c1, c2, stop, err := pipe(t, s)
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				var wg sync.WaitGroup
				errs := make(chan error, 4)
				for i, pair := range [][2]net.Conn{{c1, c2}, {c2, c1}} {
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
			})
		}
	}
}

// TestListener checks the net.Listener contract of VLink listeners:
// Close unblocks Accept with net.ErrClosed, Accept after Close fails the
// same way, Addr stays valid, concurrent Accepts each get a connection.
func TestListener(t *testing.T) {
	var lc vlink.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	const n = 4
	got := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			c, err := l.Accept()
			if err == nil {
				c.Close()
			}
			got <- err
		}()
	}
	for i := 0; i < n; i++ {
		d := vlink.Dialer{Stack: vlink.MustParse("zstd")}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for i := 0; i < n; i++ {
		if err := <-got; err != nil {
			t.Fatalf("concurrent Accept: %v", err)
		}
	}
	blocked := make(chan error, 1)
	go func() { _, err := l.Accept(); blocked <- err }()
	time.Sleep(10 * time.Millisecond)
	l.Close()
	select {
	case err := <-blocked:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
	if l.Addr().String() != addr {
		t.Fatal("Addr changed after Close")
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("port still accepting after Close")
	}
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
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

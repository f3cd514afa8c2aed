package parallelstreams

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/factories/tcp"
	_ "github.com/vlink-dev/vlink/filters/compress"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/layer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a terminal factory for tests,
// "rec:id=NAME,hang-after=N,local=IP": TCP that records every connection
// it dials under NAME, and makes every dial after the first N (if N > 0)
// wait until its context ends, so a test can cut a substream or leave a
// session incomplete; it dials from IP if given.
type recorder struct {
	id        string
	hangAfter int
	local     string
}

var recorded = struct {
	sync.Mutex
	conns    map[string][]net.Conn
	attempts map[string]int
}{conns: map[string][]net.Conn{}, attempts: map[string]int{}}

func init() {
	layer.Register(layer.Spec{
		Name: "rec", Kind: layer.KindFactory, Terminal: true,
		Summary: "test: TCP that records its connections",
		Params: []layer.Param{
			{Name: "id", Type: layer.TypeString},
			{Name: "hang-after", Type: layer.TypeInt, Min: 0, Max: 1000},
			{Name: "local", Type: layer.TypeString},
		},
		New: func(a layer.Args) (any, error) {
			return &recorder{id: a.String("id"), hangAfter: a.Int("hang-after"), local: a.String("local")}, nil
		},
	})
}

func (r *recorder) DialContext(ctx context.Context, network, address string, _ layer.ContextDialer) (net.Conn, error) {
	recorded.Lock()
	n := recorded.attempts[r.id]
	recorded.attempts[r.id]++
	recorded.Unlock()
	if r.hangAfter > 0 && n >= r.hangAfter {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	var d net.Dialer
	if r.local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(r.local)}
	}
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	recorded.Lock()
	recorded.conns[r.id] = append(recorded.conns[r.id], c)
	recorded.Unlock()
	return c, nil
}

func recordedConns(id string) []net.Conn {
	recorded.Lock()
	defer recorded.Unlock()
	return append([]net.Conn(nil), recorded.conns[id]...)
}

// listen starts a VLink listener on loopback; it is closed by cleanup.
func listen(t testing.TB, lc vlink.ListenConfig) *vlink.Listener {
	t.Helper()
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// dialPair dials l with stack and returns both ends.
func dialPair(t testing.TB, l *vlink.Listener, stack string) (client, server net.Conn) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	d := &vlink.Dialer{Stack: vlink.MustParse(stack), Timeout: 10 * time.Second}
	t.Cleanup(func() { d.Close() })
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("dial %s: %v", stack, err)
	}
	r := <-ch
	if r.err != nil {
		c.Close()
		t.Fatalf("accept: %v", r.err)
	}
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c, r.c
}

// stream is a reproducible byte stream: a seed gives the same bytes, so a
// receiver can check what it got without a copy of everything sent.
type stream struct{ r *rand.ChaCha8 }

func newStream(seed uint64) *stream {
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	return &stream{rand.NewChaCha8(s)}
}

func (s *stream) Read(p []byte) (int, error) { return s.r.Read(p) }

// sendSum writes n bytes of the seeded stream to w and returns their hash.
func sendSum(w io.Writer, seed uint64, n int64) ([32]byte, error) {
	h := sha256.New()
	_, err := io.CopyN(io.MultiWriter(w, h), newStream(seed), n)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, err
}

// prefixCheck reads r to its end or error and reports how many bytes it
// got and whether they are exactly the seeded stream's first bytes.
func prefixCheck(r io.Reader, seed uint64) (n int64, ok bool, err error) {
	want := newStream(seed)
	got := make([]byte, 64<<10)
	exp := make([]byte, 64<<10)
	ok = true
	for {
		m, rerr := r.Read(got)
		if m > 0 {
			io.ReadFull(want, exp[:m])
			for i := range m {
				if got[i] != exp[i] {
					ok = false
				}
			}
			n += int64(m)
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = nil
			}
			return n, ok, rerr
		}
	}
}

func uniqueID() string { return fmt.Sprintf("r%d", rand.Uint64()) }

// allowAll lets a listener forward anywhere: only for tests.
func allowAll() []selector.Rule { return []selector.Rule{{Host: "*", Action: selector.Direct}} }

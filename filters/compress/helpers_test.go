package compress

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaultLevel returns a codec's default level.
func defaultLevel(name string) int {
	s, err := lookupCodec(name)
	if err != nil {
		panic(err)
	}
	return s.defLevel
}

func mustNew(tb testing.TB, name string, level int) *Filter {
	tb.Helper()
	f, err := New(name, level)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// textCorpus returns n bytes of deterministic log lines and JSON records,
// the kind of traffic compression is for.
func textCorpus(n int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	users := []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}
	paths := []string{"/api/v1/users", "/api/v1/orders", "/static/app.js", "/healthz", "/api/v2/search", "/login"}
	levels := []string{"INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"}
	methods := []string{"GET", "GET", "GET", "POST", "PUT", "DELETE"}
	var b bytes.Buffer
	b.Grow(n + 512)
	t := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	for b.Len() < n {
		t = t.Add(time.Duration(r.IntN(5000)) * time.Microsecond)
		if r.IntN(3) == 0 {
			fmt.Fprintf(&b, `{"ts":%q,"user":%q,"id":%d,"order":{"items":%d,"total":%d.%02d,"currency":"EUR"},"tags":["%s","%s"],"ok":%t}`+"\n",
				t.Format(time.RFC3339Nano), users[r.IntN(len(users))], r.IntN(1e6), r.IntN(20), r.IntN(1000), r.IntN(100),
				users[r.IntN(len(users))], paths[r.IntN(len(paths))], r.IntN(10) != 0)
			continue
		}
		fmt.Fprintf(&b, "%s %-5s [worker-%d] %s %s/%d status=%d dur=%d.%dms bytes=%d req=%016x\n",
			t.Format("2006-01-02T15:04:05.000000Z07:00"), levels[r.IntN(len(levels))], r.IntN(16),
			methods[r.IntN(len(methods))], paths[r.IntN(len(paths))], r.IntN(10000),
			[]int{200, 200, 200, 201, 204, 304, 404, 500}[r.IntN(8)], r.IntN(300), r.IntN(10), r.IntN(100000), r.Uint64())
	}
	return b.Bytes()[:n]
}

// encode returns the wire form of the given writes.
func encode(tb testing.TB, name string, level int, writes ...[]byte) []byte {
	tb.Helper()
	var wire bytes.Buffer
	c := newConn(&testnet.FakeConn{W: &wire}, name, mustNew(tb, name, level).codec)
	for _, w := range writes {
		if _, err := c.Write(w); err != nil {
			tb.Fatal(err)
		}
	}
	return wire.Bytes()
}

// ended returns wire followed by an end frame: a whole stream, as a writer
// that called CloseWrite sent it.
func ended(wire []byte) []byte {
	return append(bytes.Clone(wire), frame(frameEnd, 0, nil)...)
}

// frame builds one frame by hand.
func frame(t frameType, rawLen int, payload []byte) []byte {
	var h header
	h.set(t, rawLen, len(payload))
	return append(h[:], payload...)
}

var codecNames = []string{"zstd", "s2", "deflate", "lz4"}

package ssh

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"testing"
)

// recorder is a net.Conn that records each write it gets.
type recorder struct {
	net.Conn
	writes [][]byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

// stream builds what x/crypto/ssh writes: the version line, clear-text
// packets up to NEWKEYS, then GCM packets; it returns the bytes and each
// packet's span.
func stream(rng *rand.Rand, packets int) ([]byte, [][2]int) {
	b := []byte("SSH-2.0-vlink\r\n")
	var spans [][2]int
	clear := func(msg byte, n int) {
		start := len(b)
		b = binary.BigEndian.AppendUint32(b, uint32(1+1+n))
		b = append(b, 4, msg) // padding length, message type
		for i := 0; i < n; i++ {
			b = append(b, byte(rng.Uint32()))
		}
		spans = append(spans, [2]int{start, len(b)})
	}
	clear(20, 900) // KEXINIT
	clear(30, 40)  // KEX_ECDH_INIT
	clear(21, 0)   // NEWKEYS
	for i := 0; i < packets; i++ {
		start := len(b)
		n := 16 * (1 + rng.IntN(2100)) // up to ~33 KiB
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		for j := 0; j < n+16; j++ {
			b = append(b, byte(rng.Uint32()))
		}
		spans = append(spans, [2]int{start, len(b)})
	}
	return b, spans
}

// TestFramer writes such a stream in pieces cut as a 4 KiB bufio.Writer
// cuts it, and at random: every byte must come out in order, each GCM
// packet in a single write.
func TestFramer(t *testing.T) {
	for _, mode := range []string{"bufio", "random"} {
		t.Run(mode, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			packets := 200
			if mode == "random" {
				packets = 40 // many small writes per packet: each re-copies what is held
			}
			data, spans := stream(rng, packets)
			rec := &recorder{}
			f := &framer{conn: rec}
			pos := 0
			for pos < len(data) {
				var n int
				if mode == "bufio" {
					// x/crypto: the 4-byte length, then the rest, which
					// bufio turns into 4096 bytes and the remainder.
					n = 4096
					for _, s := range spans {
						if pos == s[0] {
							n = 4
						} else if pos > s[0] && pos < s[1] && pos+n > s[1] {
							n = s[1] - pos
						}
					}
					if pos < 15 {
						n = 15
					}
				} else {
					n = 1 + rng.IntN(9000)
				}
				n = min(n, len(data)-pos)
				if _, err := f.write(data[pos : pos+n]); err != nil {
					t.Fatal(err)
				}
				pos += n
			}
			if f.off {
				t.Fatal("the framer lost track of a well-formed stream")
			}
			if got := bytes.Join(rec.writes, nil); !bytes.Equal(got, data) {
				t.Fatal("the bytes written differ from the stream")
			}
			if mode == "bufio" {
				// Every GCM packet (after NEWKEYS) arrives whole.
				ends := map[int]bool{}
				for _, s := range spans {
					ends[s[1]] = true
				}
				at := 0
				for _, w := range rec.writes {
					at += len(w)
					if !ends[at] && at != 15 {
						t.Fatalf("a write ends at %d, inside a packet", at)
					}
				}
			}
		})
	}
	// A stream that is not what it should be: the framer steps aside and
	// passes everything through.
	rec := &recorder{}
	f := &framer{conn: rec}
	junk := append([]byte("SSH-2.0-x\r\n"), 0xff, 0xff, 0xff, 0xff, 1, 2, 3)
	f.write(junk)
	if !f.off || !bytes.Equal(bytes.Join(rec.writes, nil), junk) {
		t.Fatalf("on a bad length the framer held bytes back or stayed on")
	}
}

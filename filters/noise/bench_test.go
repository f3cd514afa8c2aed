package noise

import (
	"crypto/ecdh"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink/layer"
)

const benchSize = 16 << 20

// A benchPipe is a loopback TCP connection, plain or with noise, whose
// far end reads everything in reads of rbuf bytes and reports each round
// of data it has read in full.
type benchPipe struct {
	c, srv net.Conn
	round  int
	done   chan error
	rounds chan struct{}
}

// newBenchPipe makes a pipe: plain TCP for aead -1, else noise with it.
func newBenchPipe(b *testing.B, aead int, round, rbuf int) *benchPipe {
	a, s := testnet.TCPPair(b)
	p := &benchPipe{c: a, srv: s, round: round, done: make(chan error, 1), rounds: make(chan struct{}, 1)}
	if aead >= 0 {
		p.c, p.srv = pairWith(b, a, s, layer.AEAD(aead))
	}
	go func() {
		buf := make([]byte, rbuf)
		total := 0
		for {
			n, err := p.srv.Read(buf)
			total += n
			if total >= p.round {
				total -= p.round
				p.rounds <- struct{}{}
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				p.done <- err
				return
			}
		}
	}()
	return p
}

func (p *benchPipe) send(b *testing.B, data []byte, chunk int) time.Duration {
	start := time.Now()
	for off := 0; off < len(data); off += chunk {
		if _, err := p.c.Write(data[off:min(len(data), off+chunk)]); err != nil {
			b.Fatal(err)
		}
	}
	<-p.rounds
	return time.Since(start)
}

func (p *benchPipe) close(b *testing.B) {
	p.c.(closeWriter).CloseWrite()
	if err := <-p.done; err != nil {
		b.Error(err)
	}
	p.c.Close()
	p.srv.Close()
}

// BenchmarkStack measures noise over loopback TCP, with each cipher,
// against plain TCP in the same run: each sends 16 MiB per iteration, in
// rotating order, over connections kept open, and reports its median
// round: MB/s with ChaCha20-Poly1305 and with AES-256-GCM, MB/s of
// plain TCP, and the ratios (x_tcp). Writes and reads are 1 MiB / 256
// KiB (a bulk program) or 32 KiB / 32 KiB (what io.Copy and the relays
// use).
func BenchmarkStack(b *testing.B) {
	data := testnet.RandomBytes(benchSize, 3)
	for _, io := range []struct{ w, r int }{{1 << 20, 256 << 10}, {32 << 10, 32 << 10}} {
		b.Run(fmt.Sprintf("w%dK-r%dK", io.w>>10, io.r>>10), func(b *testing.B) {
			pipes := []*benchPipe{
				newBenchPipe(b, -1, len(data), io.r),
				newBenchPipe(b, int(layer.AEADChaChaPoly), len(data), io.r),
				newBenchPipe(b, int(layer.AEADAESGCM), len(data), io.r),
			}
			rounds := make([][]time.Duration, len(pipes))
			i := 0
			for b.Loop() {
				for j := range pipes {
					k := (i + j) % len(pipes)
					rounds[k] = append(rounds[k], pipes[k].send(b, data, io.w))
				}
				i++
			}
			for _, p := range pipes {
				p.close(b)
			}
			med := make([]time.Duration, len(pipes))
			for k, r := range rounds {
				slices.Sort(r)
				med[k] = r[len(r)/2]
			}
			mbs := func(k int) float64 { return float64(len(data)) / 1e6 / med[k].Seconds() }
			b.ReportMetric(mbs(0), "tcp_MB/s")
			b.ReportMetric(mbs(1), "chacha_MB/s")
			b.ReportMetric(mbs(2), "aes_MB/s")
			b.ReportMetric(float64(med[0])/float64(med[1]), "chacha_x_tcp")
			b.ReportMetric(float64(med[0])/float64(med[2]), "aes_x_tcp")
		})
	}
}

// BenchmarkSeal measures sealing and opening full records on one core,
// with each cipher.
func BenchmarkSeal(b *testing.B) {
	for _, aead := range []layer.AEAD{layer.AEADChaChaPoly, layer.AEADAESGCM} {
		b.Run(aead.String(), func(b *testing.B) {
			p := testnet.RandomBytes(MaxPlain, 1)
			send, recv := statesOf(aead)
			rec := make([]byte, 0, headerSize+maxRecord)
			out := make([]byte, MaxPlain)
			b.SetBytes(MaxPlain)
			for b.Loop() {
				rec, _ = send.seal(rec[:0], nil, p)
				if _, err := recv.open(out[:0], nil, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHandshake measures what noise adds to a connection: a
// loopback TCP connection with and without both sides of the handshake
// (one round trip, three X25519 operations per side counting key
// generation; NKpsk0, for a listener with an identity, one more each).
// The difference is the handshake's cost.
func BenchmarkHandshake(b *testing.B) {
	k, _ := ecdh.X25519().GenerateKey(rand.Reader)
	id, pub := k.Bytes(), k.PublicKey().Bytes()
	nn := layer.Handshake{Key: testKey, Transcript: testTranscript}
	server, client := nn, nn
	server.Static, client.PeerStatic = layer.KeyPair{Private: id, Public: pub}, pub
	for _, v := range []struct {
		name           string
		server, client *layer.Handshake
	}{
		{"tcp", nil, nil},
		{"tcp+noise", &nn, &nn},
		{"tcp+noise-identity", &server, &client},
	} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				a, s := testnet.TCPPair(b)
				if v.server != nil {
					ch := make(chan error, 1)
					go func() {
						_, err := Filter{}.ServerHandshake(s, *v.server)
						ch <- err
					}()
					_, err := Filter{}.ClientHandshake(a, *v.client)
					if err2 := <-ch; err != nil || err2 != nil {
						b.Fatal(err, err2)
					}
				}
				a.Close()
				s.Close()
			}
		})
	}
}

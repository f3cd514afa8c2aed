package compress

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/filters/identity"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink/layer"
)

const benchCorpus = 8 << 20

var benchData = sync.OnceValue(func() map[string][]byte {
	return map[string][]byte{"text": textCorpus(benchCorpus), "random": testnet.RandomBytes(benchCorpus, 7)}
})

var benchKinds = []string{"text", "random"}

// BenchmarkCodec measures each codec on its own, block by block as the
// writer and reader use it: MB/s on one core and the compression ratio
// (raw bytes over wire bytes, frame headers and raw fallbacks included).
func BenchmarkCodec(b *testing.B) {
	for _, s := range codecSpecs {
		levels := []int{s.defLevel}
		if s.minLevel != s.defLevel {
			levels = append(levels, s.minLevel)
		}
		for _, level := range append(levels, s.maxLevel) {
			codec := s.new(level)
			for _, kind := range benchKinds {
				data := benchData()[kind]
				var blocks [][]byte
				for off := 0; off < len(data); off += MaxBlock {
					blocks = append(blocks, data[off:min(len(data), off+MaxBlock)])
				}
				dst := make([]byte, payloadRoom)
				b.Run(fmt.Sprintf("%s-%d/%s/compress", s.name, level, kind), func(b *testing.B) {
					b.SetBytes(int64(len(data)))
					wire := 0
					for b.Loop() {
						wire = 0
						for _, blk := range blocks {
							n := codec.compress(dst, blk, len(blk)-len(blk)>>minSavingShift)
							if n == 0 {
								n = len(blk)
							}
							wire += headerSize + n
						}
					}
					b.ReportMetric(float64(len(data))/float64(wire), "ratio")
				})
				payloads := make([][]byte, len(blocks))
				for i, blk := range blocks {
					if n := codec.compress(dst, blk, len(blk)-len(blk)>>minSavingShift); n > 0 {
						payloads[i] = append([]byte(nil), dst[:n]...)
					}
				}
				out := make([]byte, MaxBlock)
				b.Run(fmt.Sprintf("%s-%d/%s/decompress", s.name, level, kind), func(b *testing.B) {
					b.SetBytes(int64(len(data)))
					for b.Loop() {
						for i, blk := range blocks {
							if payloads[i] == nil {
								copy(out, blk) // a raw frame costs a copy
								continue
							}
							if err := codec.decompress(out[:len(blk)], payloads[i]); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}

// A benchPipe is a loopback TCP connection wrapped by a filter (nil:
// plain TCP) whose far end reads everything into a 256 KiB buffer and
// reports each round of data it has read in full.
type benchPipe struct {
	c, srv net.Conn
	round  int
	done   chan error
	rounds chan struct{}
}

func newBenchPipe(b *testing.B, f layer.Filter, round int) *benchPipe {
	a, s := testnet.TCPPair(b)
	return newBenchPipeOn(a, s, f, round)
}

// newBenchPipeOn is newBenchPipe over a given connection pair.
func newBenchPipeOn(a, s net.Conn, f layer.Filter, round int) *benchPipe {
	p := &benchPipe{c: a, srv: s, round: round, done: make(chan error, 1), rounds: make(chan struct{}, 1)}
	if f != nil {
		p.c, _ = f.Client(a)
		p.srv, _ = f.Server(s)
	}
	go func() {
		buf := make([]byte, 256<<10)
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

// send writes data in writes of chunk bytes and returns the time until
// the far end has read it all.
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

// BenchmarkStack measures whole connections over loopback TCP: plain TCP,
// the identity filter and the stack under test each send the 8 MiB corpus
// once per iteration, in rotating order, over connections kept open, so
// the baselines share the machine's state with the stack. The machine is
// shared and noisy, so each reports its median round: MB/s for the stack
// and ratios to the baselines (x_tcp, x_identity). Writes are 1 MiB (a
// bulk sender) or 32 KiB (what io.Copy hands a connection when relaying).
func BenchmarkStack(b *testing.B) {
	type stack struct {
		name string
		f    layer.Filter
	}
	stacks := []stack{{"identity", identity.Filter{}}}
	for _, name := range codecNames {
		stacks = append(stacks, stack{name, mustNew(b, name, defaultLevel(name))})
	}
	for _, kind := range benchKinds {
		data := benchData()[kind]
		for _, chunk := range []int{1 << 20, 32 << 10} {
			for _, st := range stacks {
				b.Run(fmt.Sprintf("%s/w%dK/%s", kind, chunk>>10, st.name), func(b *testing.B) {
					pipes := []*benchPipe{newBenchPipe(b, nil, len(data)), newBenchPipe(b, identity.Filter{}, len(data)), newBenchPipe(b, st.f, len(data))}
					rounds := make([][]time.Duration, len(pipes))
					i := 0
					for b.Loop() {
						for j := range pipes {
							k := (i + j) % len(pipes)
							rounds[k] = append(rounds[k], pipes[k].send(b, data, chunk))
						}
						i++
					}
					for _, p := range pipes {
						p.close(b)
					}
					best := make([]time.Duration, len(pipes))
					for k, r := range rounds {
						slices.Sort(r)
						best[k] = r[len(r)/2]
					}
					b.ReportMetric(float64(len(data))/1e6/best[2].Seconds(), "MB/s")
					b.ReportMetric(float64(len(data))/1e6/best[0].Seconds(), "tcp_MB/s")
					b.ReportMetric(float64(best[0])/float64(best[2]), "x_tcp")
					if st.name != "identity" {
						x := float64(best[1]) / float64(best[2])
						b.ReportMetric(x, "x_identity")
						if kind == "random" {
							// Incompressible bytes must not cost much: the
							// codec gives up and sends raw blocks.
							testnet.CheckTarget(b, st.name+" on random bytes / identity", x, ">=", 0.8)
						}
					}
				})
			}
		}
	}
}

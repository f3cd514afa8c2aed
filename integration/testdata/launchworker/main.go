// Command launchworker is a worker of the integration tests' jobs: it
// joins its job (launch.Join), sends every other rank bytes of its own
// on port 5000, checks by SHA-256 what every other rank sent it, and
// prints "rank R: all N-1 peers ok" or exits 1 saying what went wrong.
// With the argument "join" it only joins; with "start" it only starts
// (integration/bench/launch.sh).
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/vlink-dev/vlink/vlink/launch"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// data is what rank from sends rank to.
func data(from, to int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{byte(from), byte(to), 'j', 'o', 'b'}))
	b := make([]byte, 100<<10+from*13+to)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "start" {
		return // the baseline of launch.sh: a process started, nothing more
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := launch.Join(ctx)
	if err != nil {
		fail(err)
	}
	if len(os.Args) > 1 && os.Args[1] == "join" {
		job.Close() // launch.sh: the time to join, nothing more
		return
	}
	l, err := job.Listen()
	if err != nil {
		fail(err)
	}
	errs := make(chan error, 2*job.Size)
	go func() {
		for range job.Size - 1 {
			c, err := l.Accept()
			if err != nil {
				errs <- err
				return
			}
			go func() {
				defer c.Close()
				from := launch.RankOf(c)
				b, err := io.ReadAll(c)
				if err == nil && (from < 0 || sha256.Sum256(b) != sha256.Sum256(data(from, job.Rank))) {
					err = fmt.Errorf("%d bytes from rank %d, not what it sent", len(b), from)
				}
				if err == nil {
					_, err = c.Write([]byte{'k'})
				}
				errs <- err
			}()
		}
	}()
	for to := range job.Size {
		if to == job.Rank {
			continue
		}
		go func() {
			c, err := job.Dial(ctx, to, 5000)
			if err != nil {
				errs <- fmt.Errorf("dialing rank %d: %w", to, err)
				return
			}
			defer c.Close()
			if _, err := c.Write(data(job.Rank, to)); err != nil {
				errs <- err
				return
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				errs <- fmt.Errorf("rank %d did not acknowledge: %w", to, err)
				return
			}
			errs <- nil
		}()
	}
	for range 2 * (job.Size - 1) {
		if err := <-errs; err != nil {
			fail(err)
		}
	}
	// Leave once every rank is done: one that leaves the network early
	// takes its side of connections still in use with it.
	if err := job.Barrier(ctx); err != nil {
		fail(err)
	}
	fmt.Printf("rank %d: all %d peers ok\n", job.Rank, job.Size-1)
	job.Close()
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "launchworker: %v\n", err)
	os.Exit(1)
}

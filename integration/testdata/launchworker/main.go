// Command launchworker is a worker of the integration tests' jobs: it
// joins its job (launch.Join), sends every other rank bytes of its own
// on port 5000, checks by SHA-256 what every other rank sent it, and
// prints "rank R: all N-1 peers ok" and how its dials went ("rank R:
// dialed N-1 peers: shm S, network T"), or exits 1 saying what went
// wrong. With the argument "join" it only joins; with "start" it only
// starts (integration/bench/launch.sh); with "leave" it joins and exits
// without leaving its job; with "a2a BYTES" every rank
// sends BYTES to every other at once, and each prints how long that
// took and its CPU time (integration/bench/launch_a2a.sh).
package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
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
	switch {
	case len(os.Args) > 1 && os.Args[1] == "join":
		job.Close() // launch.sh: the time to join, nothing more
		return
	case len(os.Args) > 1 && os.Args[1] == "leave":
		// As a program killed, or one that never calls Close.
		fmt.Printf("rank %d of job %s leaves\n", job.Rank, os.Getenv(launch.EnvJob))
		os.Exit(0)
	}
	l, err := job.Listen()
	if err != nil {
		fail(err)
	}
	if len(os.Args) > 2 && os.Args[1] == "a2a" {
		n, err := strconv.ParseInt(os.Args[2], 10, 64)
		if err != nil {
			fail(err)
		}
		allToAll(ctx, job, l, n)
		return
	}
	var shm, network atomic.Int32
	err = exchange(ctx, job, l, 5000, func(from int, c net.Conn) error {
		b, err := io.ReadAll(c)
		if err == nil && (from < 0 || sha256.Sum256(b) != sha256.Sum256(data(from, job.Rank))) {
			err = fmt.Errorf("%d bytes from rank %d, not what it sent", len(b), from)
		}
		if err == nil {
			_, err = c.Write([]byte{'k'})
		}
		return err
	}, func(to int, c net.Conn) error {
		if launch.PathOf(c) == "shm" {
			shm.Add(1)
		} else {
			network.Add(1)
		}
		if _, err := c.Write(data(job.Rank, to)); err != nil {
			return err
		}
		c.(interface{ CloseWrite() error }).CloseWrite()
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return fmt.Errorf("rank %d did not acknowledge: %w", to, err)
		}
		return nil
	})
	if err != nil {
		fail(err)
	}
	// Leave once every rank is done: one that leaves the network early
	// takes its side of connections still in use with it.
	if err := job.Barrier(ctx); err != nil {
		fail(err)
	}
	fmt.Printf("rank %d: all %d peers ok\n", job.Rank, job.Size-1)
	fmt.Printf("rank %d: dialed %d peers: shm %d, network %d\n", job.Rank, job.Size-1, shm.Load(), network.Load())
	job.Close()
}

// exchange connects to port on every other rank and runs send on each
// connection, and runs recv on each of the other ranks' connections,
// all at once; it returns the first error once all are done.
func exchange(ctx context.Context, job *launch.Job, l net.Listener, port int, recv, send func(rank int, c net.Conn) error) error {
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
				errs <- recv(launch.RankOf(c), c)
			}()
		}
	}()
	for to := range job.Size {
		if to == job.Rank {
			continue
		}
		go func() {
			c, err := job.Dial(ctx, to, port)
			if err != nil {
				errs <- fmt.Errorf("dialing rank %d: %w", to, err)
				return
			}
			defer c.Close()
			errs <- send(to, c)
		}()
	}
	var first error
	for range 2 * (job.Size - 1) {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// allToAll sends n bytes to every other rank and reads n from each, all
// at once, between two barriers; rank by rank, it prints the time from
// the first barrier to the last byte read, and its CPU time over that.
func allToAll(ctx context.Context, job *launch.Job, l net.Listener, n int64) {
	buf := make([]byte, 256<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if err := job.Barrier(ctx); err != nil {
		fail(err)
	}
	start, cpu0 := time.Now(), cpuTime()
	err := exchange(ctx, job, l, 5001, func(from int, c net.Conn) error {
		got, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, make([]byte, 256<<10))
		if err == nil && got != n {
			err = fmt.Errorf("%d bytes from rank %d, want %d", got, from, n)
		}
		return err
	}, func(_ int, c net.Conn) (err error) {
		for left := n; left > 0 && err == nil; left -= int64(len(buf)) {
			_, err = c.Write(buf[:min(left, int64(len(buf)))])
		}
		return err
	})
	if err != nil {
		fail(err)
	}
	took, cpu := time.Since(start), cpuTime()-cpu0
	if err := job.Barrier(ctx); err != nil {
		fail(err)
	}
	fmt.Printf("rank %d: a2a %d bytes to each of %d peers in %.3f s, cpu %.3f s\n", job.Rank, n, job.Size-1, took.Seconds(), cpu.Seconds())
	job.Close()
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "launchworker: %v\n", err)
	os.Exit(1)
}

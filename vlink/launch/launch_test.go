package launch_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/control"
	"github.com/vlink-dev/vlink/vlink/launch"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

// job starts a relay for a job of size workers and returns each rank's
// environment, as vlink launch gives it.
func job(t *testing.T, size int) []map[string]string {
	t.Helper()
	key := []byte("a job key of 16 bytes or more, made by the launcher")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	relay, err := control.NewRelay(control.RelayConfig{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := relay.Listen(ctx, "127.0.0.1:0", key)
	if err != nil {
		t.Fatal(err)
	}
	go relay.Serve(l)
	t.Cleanup(func() { relay.Close() })
	dir := t.TempDir()
	id := make([]byte, 16)
	rand.Read(id)
	envs := make([]map[string]string, size)
	for r := range envs {
		kf := filepath.Join(dir, launch.RankName(r)+".key")
		if err := os.WriteFile(kf, vlink.NodeKey(key, launch.RankName(r)), 0o600); err != nil {
			t.Fatal(err)
		}
		envs[r] = map[string]string{launch.EnvRank: fmt.Sprint(r), launch.EnvSize: fmt.Sprint(size),
			launch.EnvRelay: l.Addr().String(), launch.EnvNode: launch.RankName(r), launch.EnvNodeKeyFile: kf,
			launch.EnvJob: hex.EncodeToString(id)}
	}
	return envs
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestAllToAll: every rank of a job of 4 sends every other its own bytes;
// each checks what it got by SHA-256, the sender's rank and the port.
// Ranks that both listen on shared memory (as on one host) talk over
// it, the others through the job's network.
func TestAllToAll(t *testing.T) {
	for _, tc := range []struct {
		name string
		shm  [4]bool // which ranks take shared memory; the others have VLINK_SHM=off
	}{
		{"network", [4]bool{}},
		{"shm", [4]bool{true, true, true, true}},
		{"mixed", [4]bool{true, true, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			envs := job(t, len(tc.shm))
			for r, on := range tc.shm {
				if !on {
					envs[r][vlink.EnvShm] = "off"
				}
			}
			allToAll(t, envs, func(from, to int) string {
				if tc.shm[from] && tc.shm[to] {
					return "shm"
				}
				return "network"
			})
		})
	}
}

// allToAll runs an all-to-all among the ranks of envs, and checks that
// the connection from one rank to another took path(from, to): "shm",
// or "network" for any path through the job's network.
func allToAll(t *testing.T, envs []map[string]string, path func(from, to int) string) {
	const port = 5000
	size := len(envs)
	data := func(from, to int) []byte { return testnet.RandomBytes(64<<10+from*7+to, uint64(from*size+to)) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, 2*size*size)
	for r := range size {
		go func() {
			j, err := launch.JoinEnv(ctx, getenv(envs[r]))
			if err != nil {
				errs <- err
				return
			}
			defer j.Close()
			if on := j.SharedMemory() == nil; on != (envs[r][vlink.EnvShm] != "off") {
				errs <- fmt.Errorf("rank %d: SharedMemory() = %v", r, j.SharedMemory())
				return
			}
			l, err := j.Listen()
			if err != nil {
				errs <- err
				return
			}
			defer l.Close()
			got := make(chan error, size)
			go func() {
				for range size - 1 {
					c, err := l.Accept()
					if err != nil {
						got <- err
						return
					}
					go func() {
						defer c.Close()
						from := launch.RankOf(c)
						b, err := io.ReadAll(c)
						switch {
						case err != nil:
							got <- err
						case from < 0 || sha256.Sum256(b) != sha256.Sum256(data(from, r)):
							got <- fmt.Errorf("rank %d got %d bytes from rank %d, not what it sent", r, len(b), from)
						case launch.PortOf(c) != port:
							got <- fmt.Errorf("rank %d: PortOf = %d, want %d", r, launch.PortOf(c), port)
						default:
							c.Write([]byte{'k'})
							got <- nil
						}
					}()
				}
			}()
			for to := range size {
				if to == r {
					continue
				}
				go func() {
					c, err := j.Dial(ctx, to, port)
					if err != nil {
						errs <- fmt.Errorf("rank %d dialing rank %d: %w", r, to, err)
						return
					}
					defer c.Close()
					p := launch.PathOf(c)
					if p != "shm" {
						p = "network"
					}
					if want := path(r, to); p != want {
						errs <- fmt.Errorf("rank %d to rank %d went by %s (PathOf %q), want %s", r, to, p, launch.PathOf(c), want)
						return
					}
					c.Write(data(r, to))
					c.(interface{ CloseWrite() error }).CloseWrite()
					ack := make([]byte, 1)
					if _, err := io.ReadFull(c, ack); err != nil {
						errs <- fmt.Errorf("rank %d's bytes to rank %d: no acknowledgement: %w", r, to, err)
						return
					}
					errs <- nil
				}()
			}
			for range size - 1 {
				errs <- <-got
			}
			<-ctx.Done() // stay in the job until every rank is done
		}()
	}
	for range 2 * size * (size - 1) {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestLocalJoinsLate: a rank that dials another of its host before that
// one listens, and sees it join (listen, then register) just after its
// first try, still reaches it over shared memory.
func TestLocalJoinsLate(t *testing.T) {
	envs := job(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j1, err := launch.JoinEnv(ctx, getenv(envs[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer j1.Close()
	var j0 *launch.Job
	joined := make(chan error, 1)
	launch.OnLocalDial(j1, func(err error) {
		if err != nil && j0 == nil {
			// Rank 0 joins between rank 1's try here and its dial
			// through the network.
			j0, err = launch.JoinEnv(ctx, getenv(envs[0]))
			joined <- err
		}
	})
	c, err := j1.Dial(ctx, 0, 5000)
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	defer j0.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if launch.PathOf(c) != "shm" {
		t.Errorf("rank 1 reached rank 0, which joined late, by %q, want shm", launch.PathOf(c))
	}
}

func TestJoinRefuses(t *testing.T) {
	envs := job(t, 2)
	ctx := context.Background()
	if _, err := launch.JoinEnv(ctx, getenv(nil)); !errors.Is(err, launch.ErrNotLaunched) {
		t.Errorf("no environment: %v", err)
	}
	bad := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range envs[0] {
			m[a] = b
		}
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"rank beyond the size", bad(launch.EnvRank, "2")},
		{"not a number", bad(launch.EnvSize, "two")},
		{"another rank's name", bad(launch.EnvNode, launch.RankName(1))},
		{"another rank's key", bad(launch.EnvNodeKeyFile, envs[1][launch.EnvNodeKeyFile])},
		{"a job id that is not one", bad(launch.EnvJob, "../../x")},
		{"shared memory neither on, off nor auto", bad(vlink.EnvShm, "0")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if j, err := launch.JoinEnv(ctx, getenv(tc.env)); err == nil {
				j.Close()
				t.Fatal("joined")
			}
		})
	}
}

// TestBarrier: no rank leaves a barrier before every rank reached it,
// three times in a row, with rank 0 joining last.
func TestBarrier(t *testing.T) {
	const size, rounds = 4, 3
	envs := job(t, size)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var arrived [rounds]atomic.Int32
	errs := make(chan error, size)
	for r := range size {
		go func() {
			if r == 0 {
				time.Sleep(100 * time.Millisecond) // the others wait for rank 0 to join
			}
			j, err := launch.JoinEnv(ctx, getenv(envs[r]))
			if err != nil {
				errs <- err
				return
			}
			defer j.Close()
			for round := range rounds {
				time.Sleep(time.Duration(r) * 10 * time.Millisecond)
				arrived[round].Add(1)
				if err := j.Barrier(ctx); err != nil {
					errs <- err
					return
				}
				if n := arrived[round].Load(); n != size {
					errs <- fmt.Errorf("rank %d left barrier %d with %d of %d ranks arrived", r, round+1, n, size)
					return
				}
			}
			errs <- nil
			<-ctx.Done() // stay for the others' last release
		}()
	}
	for range size {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

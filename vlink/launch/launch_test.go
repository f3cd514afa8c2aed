package launch_test

import (
	"context"
	"crypto/sha256"
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
	envs := make([]map[string]string, size)
	for r := range envs {
		kf := filepath.Join(dir, launch.RankName(r)+".key")
		if err := os.WriteFile(kf, vlink.NodeKey(key, launch.RankName(r)), 0o600); err != nil {
			t.Fatal(err)
		}
		envs[r] = map[string]string{launch.EnvRank: fmt.Sprint(r), launch.EnvSize: fmt.Sprint(size),
			launch.EnvRelay: l.Addr().String(), launch.EnvNode: launch.RankName(r), launch.EnvNodeKeyFile: kf}
	}
	return envs
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestAllToAll: every rank of a job of 4 sends every other its own bytes
// through the job's network; each checks what it got by SHA-256 and the
// sender's rank.
func TestAllToAll(t *testing.T) {
	const size, port = 4, 5000
	envs := job(t, size)
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

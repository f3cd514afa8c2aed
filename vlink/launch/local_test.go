//go:build linux

package launch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/shm"
)

func FuzzLocalHello(f *testing.F) {
	f.Add(localHello{rank: 3, port: 5000}.append(nil), 4)
	f.Add([]byte{localVersion, 0, 0, 0, 9, 0, 1}, 4)
	f.Add([]byte{2, 0, 0, 0, 0, 0, 1}, 1)
	f.Add([]byte{}, 1)
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		h, err := parseLocalHello(b, size)
		if err != nil {
			if !errors.Is(err, errLocalHello) {
				t.Fatalf("%v does not match errLocalHello", err)
			}
			return
		}
		if int64(h.rank) >= int64(size) || h.port == 0 {
			t.Fatalf("took rank %d, port %d in a job of %d", h.rank, h.port, size)
		}
		if !bytes.Equal(h.append(nil), b) {
			t.Fatalf("% x decodes to %+v, which encodes to % x", b, h, h.append(nil))
		}
	})
}

// localPair returns rank 0's listener (over shared memory, and a TCP
// listener no one dials standing for the job's network) and rank 1's
// job, which reaches rank 0 over shared memory, in a job of 2.
func localPair(t *testing.T) (*listener, *Job, *shm.Factory) {
	t.Helper()
	f, err := shm.New(shm.Options{Dir: filepath.Join(t.TempDir(), "shm")})
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef"
	local, err := f.ListenName(localName(id, 0))
	if err != nil {
		t.Fatal(err)
	}
	network, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newListener(network, local, 0, 2)
	t.Cleanup(func() { l.Close() })
	return l, &Job{Rank: 1, Size: 2, job: id, shm: f}, f
}

// TestLocalHostile: a rank's shared-memory listener answers a broken
// hello with nothing but the end of the connection, and a dialer that
// says nothing holds up no other; the next rank's dial works, and Close
// ends the silent one at once.
func TestLocalHostile(t *testing.T) {
	l, j, f := localPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	silent, err := f.DialName(ctx, localName(j.job, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for name, hello := range map[string][]byte{
		"rank beyond the job": localHello{rank: 2, port: 80}.append(nil),
		"port 0":              localHello{rank: 1}.append(nil),
		"another version":     append([]byte{9}, localHello{rank: 1, port: 80}.append(nil)[1:]...),
		"cut short":           {localVersion, 0},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := f.DialName(ctx, localName(j.job, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(hello)
			if name == "cut short" {
				c.(interface{ CloseWrite() error }).CloseWrite()
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c)
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatal("the listener kept the connection")
			case len(b) > 0:
				t.Fatalf("the listener answered % x, want the connection ended", b)
			}
		})
	}
	c, err := j.dialLocal(ctx, 0, 5000)
	if err != nil {
		t.Fatalf("a rank's dial beside a silent one: %v", err)
	}
	defer c.Close()
	got, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if RankOf(got) != 1 || PortOf(got) != 5000 || PathOf(got) != "shm" || got.RemoteAddr().String() != RankName(1)+".vlink.alt:0" {
		t.Errorf("accepted: rank %d, port %d, path %q, from %v; want rank 1, port 5000, shm, from rank1", RankOf(got), PortOf(got), PathOf(got), got.RemoteAddr())
	}
	c.Write([]byte("ping"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(got, b); err != nil || string(b) != "ping" {
		t.Errorf("read %q, %v", b, err)
	}
	start := time.Now()
	l.Close()
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(silent); errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Errorf("the silent dialer after Close: %v after %v, want its connection ended at once", err, time.Since(start))
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := j.dialLocal(ctx, 0, 5000); err == nil {
		t.Error("dialed a rank whose listener is closed")
	}
}

// TestGreetAfterClose: a connection the shared-memory listener hands
// over as the rank's listener closes (both were ready at once) is
// closed at once, not left to its hello's 10 s bound after Close saw
// none pending.
func TestGreetAfterClose(t *testing.T) {
	l, _, _ := localPair(t)
	l.Close()
	ours, theirs := net.Pipe()
	defer theirs.Close()
	l.greet(ours)
	theirs.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := theirs.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the dialer's end of a connection greeted after Close: %v, want it closed at once", err)
	}
	l.wg.Wait()
}

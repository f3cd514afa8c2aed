//go:build linux

package shm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBadSetup: a dialer that sends a wrong set-up is refused, and the
// listener goes on accepting.
func TestBadSetup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	f, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.Copy(c, c)
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	sock := filepath.Join(dir, "shm-"+port+".sock")

	memfd := func(size int, seal bool) int {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, int64(size))
		if seal {
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		}
		return fd
	}
	efd := func() int {
		fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
		return fd
	}
	regular := func() int {
		fd, err := unix.Open(filepath.Join(t.TempDir(), "f"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		unix.Ftruncate(fd, int64(mappingSize(minRingSize)))
		return fd
	}
	good := mappingSize(minRingSize)
	for _, tc := range []struct {
		name  string
		hello []byte
		fds   func() []int
	}{
		{"no descriptors", encodeHello(minRingSize), func() []int { return nil }},
		{"too few", encodeHello(minRingSize), func() []int { return []int{memfd(good, true), efd()} }},
		{"unsealed memory", encodeHello(minRingSize), func() []int { return []int{memfd(good, false), efd(), efd(), efd(), efd()} }},
		{"memory too small", encodeHello(minRingSize), func() []int { return []int{memfd(good-4096, true), efd(), efd(), efd(), efd()} }},
		{"a regular file", encodeHello(minRingSize), func() []int { return []int{regular(), efd(), efd(), efd(), efd()} }},
		{"a bell that is no eventfd", encodeHello(minRingSize), func() []int { return []int{memfd(good, true), efd(), regular(), efd(), efd()} }},
		{"a bad ring size", encodeHello(3000), func() []int { return []int{memfd(good, true), efd(), efd(), efd(), efd()} }},
		{"not a hello", []byte("GET / HTTP/1.1\r\n"), func() []int { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fds := tc.fds()
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
			}
			if _, _, err := c.(*net.UnixConn).WriteMsgUnix(tc.hello, oob, nil); err != nil {
				t.Fatal(err)
			}
			closeFds(fds)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			var reply [1]byte
			if n, err := c.Read(reply[:]); err == nil && n == 1 && reply[0] == 0 {
				t.Fatal("the listener accepted the set-up")
			}
			// The listener still sets up good connections.
			g, err := f.DialContext(context.Background(), "tcp", l.Addr().String(), nil)
			if err != nil {
				t.Fatalf("a good dial after a bad one: %v", err)
			}
			g.Write([]byte("ok"))
			b := make([]byte, 2)
			g.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(g, b); err != nil || string(b) != "ok" {
				t.Fatalf("echo: %q, %v", b, err)
			}
			g.Close()
		})
	}
}

// TestCorruptRing: a peer that writes nonsense into the ring's shared
// words fails the connection with an error on both sides.
func TestCorruptRing(t *testing.T) {
	a, b := pair(t, minRingSize)
	defer a.Close()
	defer b.Close()
	a.Write([]byte("hello"))
	atomic.StoreUint64(a.(*conn).out.tail, 1<<40) // the peer's view of a's ring
	_, err := io.ReadAll(b)
	if !errors.Is(err, errCorrupt) {
		t.Fatalf("reading a corrupted ring: %v, want errCorrupt", err)
	}
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, ErrReset) {
		t.Fatalf("the corrupting side reads %v, want ErrReset", err)
	}
}

// TestPeerKilled: a peer process killed while it sends is an error for
// the reader, not the end of the stream, and a peer killed while this
// side waits for room in the ring fails the write.
func TestPeerKilled(t *testing.T) {
	if os.Getenv("SHM_HELPER") != "" {
		return
	}
	dir := filepath.Join(t.TempDir(), "shm")
	f, err := New(Options{Dir: dir, RingSize: minRingSize})
	if err != nil {
		t.Fatal(err)
	}
	l, err := f.Listen(context.Background(), "tcp", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	helper.Env = append(os.Environ(), "SHM_HELPER=1", "SHM_DIR="+dir, "SHM_ADDR="+l.Addr().String())
	helper.Stderr = os.Stderr
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Wait()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The helper says when it has written; then it is killed.
	line := make([]byte, 5)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "sent\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	helper.Process.Kill()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if !errors.Is(err, ErrReset) {
		t.Fatalf("read after the peer was killed: %d bytes, %v; want ErrReset", len(got), err)
	}
	if !strings.HasPrefix(string(got), "part") {
		t.Errorf("read %q before the reset", got)
	}
	// Writes fail too, even with room left or once the ring is full.
	if _, err := c.Write(make([]byte, 3*minRingSize)); !errors.Is(err, ErrReset) {
		t.Errorf("write to a killed peer: %v, want ErrReset", err)
	}
}

// TestHelperProcess is TestPeerKilled's peer, in a process of its own.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("SHM_HELPER") == "" {
		return
	}
	f, _ := New(Options{Dir: os.Getenv("SHM_DIR"), RingSize: minRingSize})
	c, err := f.DialContext(context.Background(), "tcp", os.Getenv("SHM_ADDR"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("partial stream"))
	os.Stdout.WriteString("sent\n")
	time.Sleep(time.Minute)
}

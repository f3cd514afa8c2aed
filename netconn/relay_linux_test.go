package netconn

import (
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/testnet"
)

var zeroCopyModes = map[string]struct {
	wrapA, wrapB wrap
}{
	"tcp-tcp":        {asIs, asIs},
	"delegating":     {asDelegate, asDelegate},
	"tcp-delegating": {asIs, asDelegate},
	"hidden":         {asHidden, asHidden},
}

// TestRelayHelperProcess is the relay process of TestRelayZeroCopy, alone
// in its process so that its I/O accounting counts the relay only.
func TestRelayHelperProcess(t *testing.T) {
	mode, ok := zeroCopyModes[os.Getenv("VLINK_RELAY_HELPER")]
	if !ok {
		t.Skip("skipping: helper process of TestRelayZeroCopy")
	}
	ln := listen(t)
	fmt.Printf("addr %s\n", ln.Addr())
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	b, err := net.Dial("tcp", os.Getenv("VLINK_RELAY_BACKEND"))
	if err != nil {
		t.Fatal(err)
	}
	r0, w0 := testnet.ProcIO(t)
	aToB, bToA, err := Relay(mode.wrapA(a), mode.wrapB(b))
	r1, w1 := testnet.ProcIO(t)
	fmt.Printf("result %d %d %d %d %v\n", r1-r0, w1-w0, aToB, bToA, err)
}

// TestRelayZeroCopy proves that relaying TCP to TCP, directly or through
// wrappers delegating WriteTo/ReadFrom, moves no byte through user space
// beyond each direction's first smallCopy, while the same relay through
// wrappers that hide them does. A short exchange goes through read(2) and
// write(2) whole: each byte read once and written once.
func TestRelayZeroCopy(t *testing.T) {
	for _, tt := range []struct {
		mode      string
		size      int
		userSpace bool
	}{
		{"tcp-tcp", 32 << 20, false},
		{"delegating", 32 << 20, false},
		{"tcp-delegating", 32 << 20, false},
		{"hidden", 32 << 20, true}, // the control: the measure does see copies
		{"tcp-tcp", 1000, true},    // short: below smallCopy
	} {
		size := tt.size
		t.Run(fmt.Sprintf("%s/%d", tt.mode, size), func(t *testing.T) {
			back := listen(t)
			defer back.Close()
			addr, lines := testnet.StartHelper(t, "TestRelayHelperProcess",
				"VLINK_RELAY_HELPER="+tt.mode, "VLINK_RELAY_BACKEND="+back.Addr().String())
			client, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatalf("dial helper at %q: %v", addr, err)
			}
			defer client.Close()
			server, err := back.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer server.Close()

			up, down := testnet.RandomBytes(size, 1), testnet.RandomBytes(size, 2)
			errc := make(chan error, 2)
			go send(client, up, errc)
			go send(server, down, errc)
			sumUp := make(chan [32]byte, 1)
			go func() { s, _, _ := receive(server); sumUp <- s }()
			if s, _, err := receive(client); err != nil || s != sha256.Sum256(down) {
				t.Errorf("client received corrupt data (err %v)", err)
			}
			if s := <-sumUp; s != sha256.Sum256(up) {
				t.Error("server received corrupt data")
			}
			for range 2 {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}

			var rchar, wchar, aToB, bToA int64
			found := false
			for lines.Scan() {
				if _, err := fmt.Sscanf(lines.Text(), "result %d %d %d %d", &rchar, &wchar, &aToB, &bToA); err == nil {
					found = true
				}
			}
			if !found {
				t.Fatal("helper reported no result")
			}
			t.Logf("%-14s relayed %d+%d bytes; relay process read(2) %d bytes, write(2) %d bytes", tt.mode, aToB, bToA, rchar, wchar)
			if aToB != int64(size) || bToA != int64(size) {
				t.Errorf("relay counted %d, %d; want %d each way", aToB, bToA, size)
			}
			copied := rchar + wchar
			if tt.userSpace && copied < 4*int64(size) {
				t.Errorf("relay shows %d bytes through user space, want at least %d", copied, 4*size)
			}
			// Each way's first smallCopy bytes, read and written, and
			// the helper's own reads of /proc/self/io (about 100 bytes).
			if limit := int64(4*smallCopy + 1<<10); !tt.userSpace && copied > limit {
				t.Errorf("%d bytes went through user space; want at most %d (zero-copy after the first %d each way)", copied, limit, smallCopy)
			}
		})
	}
}

// TestRelayPeerClosedEarly: a server that sends its whole answer, closes,
// and resets the connection when more bytes come (the kernel's answer to
// bytes for a closed socket) ended normally: Relay reports no error
// (vlink serve logged such connections as failed: "shutdown: transport
// endpoint is not connected").
func TestRelayPeerClosedEarly(t *testing.T) {
	for _, shape := range relayShapes {
		t.Run(shape.name, func(t *testing.T) {
			r := startRelay(t, shape.wrapA, shape.wrapB)
			answer := testnet.RandomBytes(64<<10, 1)
			if _, err := r.server.Write(answer); err != nil {
				t.Fatal(err)
			}
			r.server.Close()
			sum, n, err := receive(r.client)
			if err != nil || n != len(answer) || sum != sha256.Sum256(answer) {
				t.Fatalf("client received %d bytes, %v", n, err)
			}
			// Bytes for the closed server: its kernel resets b.
			if _, err := r.client.Write([]byte("late")); err != nil {
				t.Fatal(err)
			}
			waitTCPState(t, r.rawB, tcpClose)
			// The client's end cannot reach the server any more.
			r.client.(*net.TCPConn).CloseWrite()
			res := r.wait(t)
			if res.err != nil || res.aToB != 4 || res.bToA != int64(len(answer)) {
				t.Errorf("Relay = %d, %d, %v; want 4, %d, no error", res.aToB, res.bToA, res.err, len(answer))
			}
		})
	}
}

// tcpClose is the kernel's TCP_CLOSE state: the connection is gone.
const tcpClose = 7

// waitTCPState waits until c's kernel state is state.
func waitTCPState(t *testing.T, c *net.TCPConn, state uint8) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var info *unix.TCPInfo
		var ierr error
		rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if ierr != nil {
			t.Fatal(ierr)
		}
		if info.State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("TCP state %d after 5s, want %d", info.State, state)
		}
	}
}

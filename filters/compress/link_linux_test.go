package compress

import (
	"io"
	"net"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// kernelTCPInfo asks the kernel for c's tcp_info itself, and returns it
// with how many bytes the kernel filled: which fields this kernel has is
// decided here, never by the sampler under test, or a sampler that reads
// nothing would pass for an old kernel.
func kernelTCPInfo(t *testing.T, c *net.TCPConn) (unix.TCPInfo, uintptr) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		info  unix.TCPInfo
		size  = uint32(unsafe.Sizeof(info))
		errno unix.Errno
	)
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	}); err != nil {
		t.Fatal(err)
	}
	if errno != 0 {
		testenv.Missing(t, "needs getsockopt(TCP_INFO) on a TCP socket: %v", errno)
	}
	return info, uintptr(size)
}

// TestLinkSampler checks that tcp_info is read: after 1 MiB went through
// a loopback connection and was read, the peer acknowledges it all and
// nothing waits unsent; the sampler has rwnd_limited exactly when the
// kernel does; other connections have no sampler.
func TestLinkSampler(t *testing.T) {
	c, s := testnet.TCPPair(t)
	defer c.Close()
	defer s.Close()
	var ti unix.TCPInfo
	_, size := kernelTCPInfo(t, c)
	if size < unsafe.Offsetof(ti.Notsent_bytes)+unsafe.Sizeof(ti.Notsent_bytes) {
		testenv.Missing(t, "needs tcp_info with notsent_bytes (Linux 4.6 or later): this kernel fills %d bytes", size)
	}
	kernelRwnd := size >= unsafe.Offsetof(ti.Rwnd_limited)+unsafe.Sizeof(ti.Rwnd_limited) // Linux 4.10
	sample := linkSampler(c)
	if sample == nil {
		t.Fatal("no sampler for a *net.TCPConn")
	}
	before := sample()
	if !before.ok || before.hasRwnd != kernelRwnd {
		t.Fatalf("sample %+v on a kernel that fills %d bytes of tcp_info: want ok, hasRwnd %t", before, size, kernelRwnd)
	}
	const n = 1 << 20
	go func() {
		c.Write(make([]byte, n))
		c.CloseWrite()
	}()
	if got, err := io.Copy(io.Discard, s); err != nil || got != n {
		t.Fatalf("read %d bytes, %v", got, err)
	}
	// The last acknowledgements may still be on their way (delayed ACKs).
	after := sample()
	for deadline := time.Now().Add(5 * time.Second); after.acked-before.acked < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		after = sample()
	}
	if !after.ok || after.acked-before.acked < n || after.notsent != 0 {
		t.Errorf("samples %+v then %+v: want %d more bytes acknowledged and none unsent", before, after, n)
	}
	// The sampler reads the kernel's bytes_acked, not another field: its
	// reading falls between two of the test's own (the FIN's
	// acknowledgement may land in between).
	k1, _ := kernelTCPInfo(t, c)
	got := sample().acked
	k2, _ := kernelTCPInfo(t, c)
	if got < k1.Bytes_acked || got > k2.Bytes_acked {
		t.Errorf("sampler's acked %d, the kernel's bytes_acked %d then %d", got, k1.Bytes_acked, k2.Bytes_acked)
	}
	if linkSampler(hideType{c}) != nil {
		t.Error("a sampler for a connection that is not a *net.TCPConn")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if linkSampler(a) != nil {
		t.Error("a sampler for net.Pipe")
	}
}

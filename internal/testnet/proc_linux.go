package testnet

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// procDir is /proc/PID, or /proc/self for pid 0.
func procDir(pid int) string {
	if pid == 0 {
		return "/proc/self"
	}
	return "/proc/" + strconv.Itoa(pid)
}

// RSS returns the resident set size in bytes of process pid (0: this
// one), from /proc.
func RSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(procDir(pid) + "/status")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	tb.Fatalf("no VmRSS in %s/status", procDir(pid))
	return 0
}

// OpenFDs returns how many descriptors process pid (0: this one) has
// open, from /proc.
func OpenFDs(tb testing.TB, pid int) int {
	tb.Helper()
	ents, err := os.ReadDir(procDir(pid) + "/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}

// ProcIO returns the bytes this process passed through read(2) and
// write(2) (rchar and wchar in /proc/self/io). splice(2) and recvfrom(2)
// do not count, so a relay that keeps the bytes in the kernel adds
// nothing.
func ProcIO(tb testing.TB) (rchar, wchar int64) {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		testenv.Missing(tb, "needs the kernel's I/O accounting (/proc/self/io, CONFIG_TASK_IO_ACCOUNTING): %v", err)
	}
	for line := range strings.Lines(string(b)) {
		fmt.Sscanf(line, "rchar: %d", &rchar)
		fmt.Sscanf(line, "wchar: %d", &wchar)
	}
	return rchar, wchar
}

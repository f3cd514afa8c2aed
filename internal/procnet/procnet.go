// Package procnet reads the kernel's socket tables under /proc, for code
// that must know whether something listens without connecting to it (a
// server such as iperf3 takes any connection for a client).
package procnet

import (
	"os"
	"strconv"
	"strings"
)

// stateListen is TCP_LISTEN in /proc/net/tcp's st column.
const stateListen = "0A"

// TCPListening reports whether a TCP socket listens on port in the network
// namespace of the calling thread (/proc/thread-self/net: /proc/self/net
// would be the main thread's, which may sit in another namespace).
func TCPListening(port int) bool { return len(TCPListeners(port)) > 0 }

// TCPListeners returns the inodes of the TCP sockets listening on port in
// the network namespace of the calling thread.
func TCPListeners(port int) []uint64 {
	var inodes []uint64
	for _, table := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != stateListen {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				if ino, err := strconv.ParseUint(f[9], 10, 64); err == nil {
					inodes = append(inodes, ino)
				}
			}
		}
	}
	return inodes
}

// Holds reports whether process pid has a descriptor open on one of the
// sockets with these inodes.
func Holds(pid int, inodes []uint64) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		rest, ok := strings.CutPrefix(link, "socket:[")
		if !ok {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64)
		if err != nil {
			continue
		}
		for _, want := range inodes {
			if ino == want {
				return true
			}
		}
	}
	return false
}

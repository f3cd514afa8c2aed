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
func TCPListening(port int) bool {
	for _, table := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != stateListen {
				continue
			}
			_, hexPort, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
				return true
			}
		}
	}
	return false
}

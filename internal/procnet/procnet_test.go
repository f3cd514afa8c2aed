package procnet

import (
	"net"
	"os"
	"testing"

	"github.com/vlink-dev/vlink/internal/testenv"
)

func TestTCPListening(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			host := "127.0.0.1"
			if network == "tcp6" {
				testenv.IPv6Loopback(t)
				host = "[::1]"
			}
			l, err := net.Listen(network, host+":0")
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			if !TCPListening(port) {
				t.Fatalf("port %d listens but TCPListening says no", port)
			}
			if inodes := TCPListeners(port); len(inodes) != 1 || !Holds(os.Getpid(), inodes) {
				t.Fatalf("port %d: listener inodes %v, held by this process: %v", port, inodes, Holds(os.Getpid(), inodes))
			}
			if Holds(os.Getppid(), TCPListeners(port)) {
				t.Fatalf("the parent process holds this process's listener")
			}
			// A connected socket on another port is not a listener.
			c, err := net.Dial(network, l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			local := c.LocalAddr().(*net.TCPAddr).Port
			if TCPListening(local) {
				t.Fatalf("port %d only has a connected socket, TCPListening says it listens", local)
			}
			c.Close()
			l.Close()
			if TCPListening(port) {
				t.Fatalf("port %d closed but TCPListening says it listens", port)
			}
		})
	}
}

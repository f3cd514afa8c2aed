//go:build linux

package ssh_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/ssh"
	"github.com/vlink-dev/vlink/internal/realserver"
)

// BenchmarkWrite sends through a direct-tcpip channel of a real sshd to a
// sink, per cipher: what the ssh layer costs on its sending side.
// Compare with docs/BENCHMARKS.md's iperf3 figures against OpenSSH.
func BenchmarkWrite(b *testing.B) {
	s := realserver.StartSSHD(b, realserver.SSHDOptions{Forwarding: true})
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	// "default" offers x/crypto/ssh's list, which picks aes128-gcm too,
	// but without the framer (it cannot know the cipher in advance).
	for _, cipher := range []string{"aes128-gcm@openssh.com", "default", "chacha20-poly1305@openssh.com"} {
		b.Run(cipher, func(b *testing.B) {
			defer ssh.CloseAll()
			var ciphers []string
			if cipher != "default" {
				ciphers = []string{cipher}
			}
			f, err := ssh.New(ssh.Options{Host: s.Host, Port: s.Port, User: s.User, IdentityFiles: []string{s.UserKey.Private},
				KnownHosts: []string{s.KnownHosts}, NoAgent: true, ConfigFile: "none", Ciphers: ciphers})
			if err != nil {
				b.Fatal(err)
			}
			c, err := f.DialContext(context.Background(), "tcp", sink.Addr().String(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 128<<10)
			b.SetBytes(int64(len(buf)))
			cpu0, w0 := usage()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			cpu1, w1 := usage()
			mb := float64(b.N) * float64(len(buf)) / 1e6
			// CPU time per MB is disturbed less than MB/s by the other
			// jobs of a shared machine; write(2) calls per MB are exact.
			// Both include the sink, which runs in this process.
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/1e3/mb, "cpu-ms/MB")
			b.ReportMetric(float64(w1-w0)/mb, "writes/MB")
		})
	}
}

// usage returns the process's CPU time and its count of write system
// calls (syscw in /proc/self/io).
func usage() (time.Duration, int64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return cpu, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "syscw: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return cpu, n
		}
	}
	return cpu, 0
}

// Package testenv decides, for every test in the tree, whether what the
// test needs from outside Go is here: root, programs such as nft, sshd or
// iperf3, a C compiler. A test asks at its start. When something is
// missing, the test is skipped with one line that says what it needs and
// how to get it; where everything must run (CI=true, or
// VLINK_TEST_STRICT=1 on a developer's machine), it fails instead.
//
// Keeping the decision here, and nowhere else, is what lets `go test ./...`
// pass on a machine with only Go, while CI still runs every test: a test
// that looks for a program by itself would either fail on that machine or
// skip silently in CI. TestOneHelper enforces it.
package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// EnvStrict names the variable that makes missing requirements fail
// tests instead of skipping them, as CI=true does.
const EnvStrict = "VLINK_TEST_STRICT"

// Install is the command that installs every program the tests drive.
const Install = "integration/deps.sh"

// Strict reports whether a missing requirement fails the test: in CI
// (CI=true) and when VLINK_TEST_STRICT=1.
func Strict() bool {
	return os.Getenv("CI") == "true" || os.Getenv(EnvStrict) == "1"
}

// Missing skips tb with the reason, or fails it when Strict. The reason
// reads after "skipping: ", e.g. "needs root to make network namespaces".
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		tb.Fatalf("%s (CI=true or %s=1: nothing may be skipped)", msg, EnvStrict)
	}
	tb.Skip("skipping: " + msg)
}

// sbin holds the folders searched after PATH: Debian puts daemons (sshd,
// danted) and network tools (ip, nft) there, and an ordinary user's PATH
// leaves them out although the programs run for anyone.
var sbin = []string{"/usr/sbin", "/sbin"}

// LookPath finds a program on PATH, then in /usr/sbin and /sbin.
func LookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil || strings.Contains(name, "/") {
		return p, err
	}
	for _, dir := range sbin {
		if q, qerr := exec.LookPath(filepath.Join(dir, name)); qerr == nil {
			return q, nil
		}
	}
	return "", err
}

// Has reports whether every program is found by LookPath, for tests that
// fall back to a Go fixture when the real server is missing (outside
// Strict mode).
func Has(names ...string) bool {
	return missing(names) == nil
}

// Programs returns the programs' paths, in order, or skips tb naming the
// missing ones and the Debian packages that hold them.
func Programs(tb testing.TB, names ...string) []string {
	tb.Helper()
	if m := missing(names); m != nil {
		Missing(tb, "%s", m)
	}
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i], _ = LookPath(n)
	}
	return paths
}

// IsRoot reports whether the test runs as root.
func IsRoot() bool { return os.Geteuid() == 0 }

// Root skips tb unless it runs as root; why says what root is needed for
// ("to make network namespaces").
func Root(tb testing.TB, why string) {
	tb.Helper()
	if !IsRoot() {
		Missing(tb, "needs root %s (run the tests as root, e.g. sudo -E go test ./...)", why)
	}
}

// Netns skips tb unless it can make network namespaces joined by veth
// pairs, with firewalls when nft is among programs: root and iproute2.
func Netns(tb testing.TB, programs ...string) []string {
	tb.Helper()
	Root(tb, "to make network namespaces")
	return Programs(tb, append([]string{"ip"}, programs...)...)
}

// NonLoopbackIPv4 returns an IPv4 address of this machine beyond
// loopback, for tests that must leave it (a listener's encryption rule,
// shm's refusal of a remote peer), or skips tb.
func NonLoopbackIPv4(tb testing.TB) net.IP {
	tb.Helper()
	addrs, err := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP
		}
	}
	if err != nil {
		Missing(tb, "needs an IPv4 address beyond loopback (listing this machine's addresses: %v)", err)
	}
	Missing(tb, "needs an IPv4 address beyond loopback (a network interface with one)")
	return nil
}

// IPv6Loopback skips tb unless this machine listens on ::1.
func IPv6Loopback(tb testing.TB) {
	tb.Helper()
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		Missing(tb, "needs an IPv6 loopback (listen [::1]: %v)", err)
		return
	}
	l.Close()
}

// packages maps the programs the tests look for to their Debian packages,
// all of which integration/deps.sh installs (TestPackagesInDeps checks).
var packages = map[string]string{
	"cc":              "gcc",
	"curl":            "curl",
	"danted":          "dante-server",
	"gcc":             "gcc",
	"git":             "git",
	"groff":           "groff-base",
	"ip":              "iproute2",
	"iperf3":          "iperf3",
	"iptables":        "iptables",
	"nc":              "netcat-openbsd",
	"nft":             "nftables",
	"pgrep":           "procps",
	"setsid":          "util-linux",
	"python3":         "python3",
	"redis-benchmark": "redis-tools",
	"redis-cli":       "redis-tools",
	"redis-server":    "redis-server",
	"socat":           "socat",
	"ss":              "iproute2",
	"ssh":             "openssh-client",
	"ssh-add":         "openssh-client",
	"ssh-agent":       "openssh-client",
	"ssh-keygen":      "openssh-client",
	"sshd":            "openssh-server",
	"systemd-analyze": "systemd",
	"tc":              "iproute2",
	"tinyproxy":       "tinyproxy",
	"wget":            "wget",
	"zsh":             "zsh",
}

// A missingError names programs that were not found.
type missingError []string

func (m missingError) Error() string {
	var pkgs []string
	for _, n := range m {
		if p, ok := packages[n]; ok && !slices.Contains(pkgs, p) {
			pkgs = append(pkgs, p)
		}
	}
	s := "needs " + strings.Join(m, ", ")
	if len(pkgs) > 0 {
		s += fmt.Sprintf(" (Debian: %s; %s installs it)", strings.Join(pkgs, ", "), Install)
	}
	return s
}

func missing(names []string) error {
	var m missingError
	for _, n := range names {
		if slices.Contains(m, n) {
			continue
		}
		if _, err := LookPath(n); err != nil {
			m = append(m, n)
		}
	}
	if m == nil {
		return nil
	}
	return m
}
